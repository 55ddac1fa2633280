"""Fill-in-the-middle over HTTP on a fixture copy of SmolLM2 whose GGUF metadata names FIM token ids.

SmolLM2's vocabulary has no <fim_prefix>/<fim_suffix>/<fim_middle> tokens (ids 0-16 are <|endoftext|>,
<|im_start|>, <|im_end|>, <repo_name>, <reponame>, <file_sep>, <filename>, <gh_stars>, ...), so the fixture
names other special tokens as FIM_PRE/SUF/MID and the real <repo_name>/<file_sep> as FIM_REP/FIM_SEP. The
completions are not meaningful code; the protocol, layout, budgets and prompt cache are what is tested.
"""

from __future__ import annotations

import httpx
import pytest
from servers import LLAMA_VIM_BODY, ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def http(fim_model):
    with ServerProcess(["--model", str(fim_model), "--ctx", "2048"]) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            c.server = srv  # type: ignore[attr-defined]
            yield c
        assert srv.alive


def source_file(n_lines: int = 200, tag: str = "") -> list[str]:
    return [f"    t{i} = f{tag}(v[{i}])" for i in range(n_lines)]


def infill_body(lines: list[str], cursor: int, **extra) -> dict:
    body = dict(LLAMA_VIM_BODY, input_prefix="\n".join(lines[:cursor]) + "\n", prompt="    total_",
                input_suffix="\n".join(lines[cursor + 1:]) + "\n", input_extra=[], temperature=0, n_predict=8,
                response_fields=None)
    body.update(extra)
    return body


def test_llama_vim_exact_body(http):
    r = http.post("/infill", json=LLAMA_VIM_BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == set(LLAMA_VIM_BODY["response_fields"])  # projected, keyed by path like llama-server
    assert isinstance(body["content"], str) and body["timings/predicted_n"] <= 16
    assert body["truncated"] is False


def test_prompt_cache_reuses_all_but_the_edited_line(http):
    lines = source_file(200, tag="A")  # a 200-line file: the prefix loses whole lines, the suffix its end
    cold = http.post("/infill", json=infill_body(lines, 150)).json()
    assert cold["truncated"] is True and cold["tokens_evaluated"] > 800
    assert cold["timings"]["prompt_n"] > 0.9 * cold["tokens_evaluated"]  # a new file: (almost) nothing cached

    lines[145] = "    t145 = g(w[145], 3)  # edited"  # one line changed, a few tokens longer
    warm = http.post("/infill", json=infill_body(lines, 150)).json()
    # PSM order: everything after the edit is evaluated again, i.e. the last lines of the prefix and the
    # suffix (at most a quarter batch); everything before it comes from the cache
    assert warm["tokens_cached"] > 0.5 * warm["tokens_evaluated"]
    assert warm["timings"]["prompt_n"] < 0.45 * cold["timings"]["prompt_n"]
    assert warm["timings"]["cache_n"] == warm["tokens_cached"]
    assert warm["tokens_cached"] + warm["timings"]["prompt_n"] == warm["tokens_evaluated"]


def test_typing_on_the_cursor_line_reuses_prefix_and_suffix(http):
    """The cursor line (`prompt`) comes after FIM_MID: a key evaluates its changed tokens only, not the
    suffix (a quarter batch here) as it would before FIM_SUF."""
    lines = source_file(200, tag="B")
    first = http.post("/infill", json=infill_body(lines, 150, prompt="    t1")).json()
    second = http.post("/infill", json=infill_body(lines, 150, prompt="    t15")).json()
    assert second["tokens_cached"] >= first["tokens_evaluated"] - 4
    assert second["timings"]["prompt_n"] <= 4


def test_n_predict_zero_warms_the_cache(http):
    lines = source_file(60, tag="W")
    warm_up = http.post("/infill", json=infill_body(lines, 30, n_predict=0)).json()
    assert warm_up["content"] == "" and warm_up["tokens_predicted"] == 0
    r = http.post("/infill", json=infill_body(lines, 30)).json()
    assert r["tokens_cached"] >= r["tokens_evaluated"] - 1


def test_input_extra_uses_the_repo_level_form(http):
    lines = source_file(20, tag="X")
    plain = http.post("/infill", json=infill_body(lines, 10)).json()
    extra = [{"filename": "helpers.py", "text": "def compute(v, weight):\n    return v * weight\n"}]
    with_extra = http.post("/infill", json=infill_body(lines, 10, input_extra=extra)).json()
    assert with_extra["tokens_evaluated"] > plain["tokens_evaluated"] + 15


def test_streaming_infill(http):
    body = infill_body(source_file(20, tag="S"), 10, stream=True, n_predict=12)
    with http.stream("POST", "/infill", json=body) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    import json

    events = [json.loads(ln[6:]) for ln in lines]
    assert events[-1]["stop"] is True and "draft_n" in events[-1]["timings"]
    assert all(e["stop"] is False for e in events[:-1])


def test_t_max_predict_ms_stops_at_a_newline_once_over_budget(http):
    body = infill_body(source_file(20, tag="T"), 10, n_predict=200, t_max_predict_ms=1, n_indent=0,
                       prompt="")
    r = http.post("/infill", json=body).json()
    content = r["content"]
    if r["tokens_predicted"] < 200 and r["stop_type"] == "limit":
        assert content.endswith("\n")  # cut right after the first newline generated over budget: whole lines
    else:
        assert "\n" not in content or r["stop_type"] == "eos"


def test_openai_and_ollama_suffix(http):
    openai = pytest.importorskip("openai")
    ollama = pytest.importorskip("ollama")
    url = http.server.url  # type: ignore[attr-defined]
    name = http.get("/v1/models").json()["data"][0]["id"]
    c = openai.OpenAI(base_url=url + "/v1", api_key="x").completions.create(
        model=name, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=8,
        temperature=0)
    assert c.usage.completion_tokens <= 8 and c.usage.prompt_tokens > 10
    g = ollama.Client(host=url).generate(model=name, prompt="def add(a, b):\n    return ",
                                         suffix="\n\nprint(add(1, 2))\n", options={"num_predict": 8,
                                                                                     "temperature": 0},
                                         stream=False)
    assert g.done and g.eval_count <= 8
    assert http.get("/props").json()["fim"] is True


def test_infill_n_cmpl_reuses_the_prompt(http):
    """llama-server's `n_cmpl` on /infill: one result per completion, in order, the later ones finding the whole
    FIM prompt in the KV cache."""
    res = http.post("/infill", json=infill_body(source_file(20, tag="N"), 10, n_cmpl=2, n_predict=4,
                                                temperature=0.8, seed=3)).json()
    assert [r["index"] for r in res] == [0, 1]
    assert res[1]["timings"]["prompt_n"] == 1 and res[1]["tokens_cached"] == res[1]["tokens_evaluated"] - 1
