"""The exact request bodies of real editor plugins against a real `localspec serve`, with the clients they use.

- llama.vscode (ggml-org/llama.vscode, src/llama-server.ts `createRequestPayload`): /infill with `n_cmpl: 3`,
  `top_p: 0.99`, `samplers`, `t_max_predict_ms: 2500`, `input_extra` chunks `{text, time, filename}`; it reads
  `content` (one object, or each of an array), `tokens_cached`, `generation_settings.n_ctx`, `timings`, and
  shows `error.message`, with a hint when it starts "Field 'n_cmpl': Value must be between".
- llama.vim (autoload/llama.vim): the warm-up request (`n_predict: 0`, `samplers: []`, `response_fields: [""]`)
  and the main one (tests/servers.py's LLAMA_VIM_BODY), answered with flattened "timings/..." keys.
- Continue (continuedev/continue, core/llm/llms/LlamaCpp.ts, OpenAI.ts, Ollama.ts): its FIM template in a
  streamed `/completion` prompt; the same over `/v1/completions` (the `openai` package); `/api/show` (Continue
  sends `{"name": ...}` and switches to FIM when `template` holds `.Suffix`) then a streamed `/api/generate` with
  `suffix`, `options` and `keep_alive` (the `ollama` package), and the non-FIM `raw: true` form.

The model is SmolLM2 with FIM token ids tagged in its GGUF (tests/test_server_fim.py): the completions are not
meaningful code, so the tests assert behaviour (fields, types, a continuation, the plugin's stop rules), not text.
"""

from __future__ import annotations

import json
import re
from typing import Iterator

import httpx
import pytest
from servers import LLAMA_VIM_BODY, ServerProcess

pytestmark = pytest.mark.slow

EXTRA = [{"text": "def helper(x):\n    return 2 * x\n", "time": 1700000000, "filename": "helpers.py"}]
PREFIX = "def total(values):\n    s = 0\n    for v in values:\n"
SUFFIX = "\n    return s\n\nprint(total([1, 2, 3]))\n"

# llama.vscode's createRequestPayload(false, ...): the defaults it ships (n_predict 128, 3 completions,
# t_max_prompt_ms 500, t_max_predict_ms 2500) and defaultRequestParams spread in
VSCODE_BODY = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA,
               "prompt": "        s += ", "n_predict": 128, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
               "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 8,
               "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}
# createRequestPayload(true, "", "", chunks, "", ...): the extra context sent ahead of the next completion
VSCODE_WARMUP = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": EXTRA, "prompt": "",
                 "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
# llama.vim's ring-buffer warm-up (llama#fim_ring_update... "no samplers needed here")
VIM_WARMUP = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": LLAMA_VIM_BODY["input_extra"],
              "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
              "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}
# Continue's stable-code FIM template (the one it picks for a model named "smollm2") and its stop words
CONTINUE_PROMPT = f"<fim_prefix>{PREFIX}        s += <fim_suffix>{SUFFIX}<fim_middle>"
CONTINUE_STOP = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>", "</fim_middle>",
                 "</code>", "/src/", "#- coding: utf-8", "```"]
TIMINGS = ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second")


@pytest.fixture(scope="module")
def server(fim_model) -> Iterator[ServerProcess]:
    with ServerProcess(["--model", str(fim_model), "--ctx", "2048"]) as srv:
        yield srv
        assert srv.alive


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def name(http) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


def _until_newline(pieces: Iterator[str]) -> str:
    """What Continue does with a single-line completion: read until the first line ends, then hang up."""
    text = ""
    for p in pieces:
        text += p
        if "\n" in text.lstrip("\n"):
            break
    return text


# -- llama.vscode -----------------------------------------------------------------------------------------------

def test_llama_vscode_infill_n_cmpl_answers_three_objects(http):
    r = http.post("/infill", json=VSCODE_BODY)
    assert r.status_code == 200, r.text
    res = r.json()
    assert isinstance(res, list) and [x["index"] for x in res] == [0, 1, 2]
    for x in res:  # getComplFromContent reads each `content`; the status bar the fields below
        assert isinstance(x["content"], str) and isinstance(x["tokens_cached"], int)
        assert x["generation_settings"]["n_ctx"] == 2048
        assert x["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]
        assert x["generation_settings"]["temperature"] == 1.0  # not listed: llama-server's T = 1
        assert x["generation_settings"]["top_p"] == 0.99 and x["generation_settings"]["t_max_predict_ms"] == 2500
        assert all(isinstance(x["timings"][k], (int, float)) for k in TIMINGS)
        assert x["tokens_predicted"] <= 128 and isinstance(x["truncated"], bool)
    assert res[1]["timings"]["prompt_n"] == 1  # the later completions find the prompt in the cache
    assert http.get("/props").json()["default_generation_settings"]["n_ctx"] == 2048  # its token limits


def test_llama_vscode_warm_up_then_completion_reuses_the_extra_context(http):
    r = http.post("/infill", json=VSCODE_WARMUP)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "" and r.json()["tokens_predicted"] == 0
    warm = r.json()["tokens_evaluated"]
    one = http.post("/infill", json=dict(VSCODE_BODY, n_cmpl=1)).json()
    assert isinstance(one, dict) and isinstance(one["content"], str)  # one completion: one object
    assert one["tokens_cached"] >= warm - 4  # the extra chunks (and BOS) were already in the cache


def test_llama_vscode_n_cmpl_out_of_range_is_the_message_it_shows(http):
    r = http.post("/infill", json=dict(VSCODE_BODY, n_cmpl=17))
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert msg == "Field 'n_cmpl': Value must be between 1 <= value <= 16, but got 17"
    assert http.post("/infill", json=dict(VSCODE_BODY, n_cmpl=0)).json()["error"]["message"].startswith(
        "Field 'n_cmpl': Value must be between")


# -- llama.vim --------------------------------------------------------------------------------------------------

def test_llama_vim_warm_up_and_main_request(http):
    r = http.post("/infill", json=VIM_WARMUP)
    assert r.status_code == 200, r.text
    assert r.json() == {}  # response_fields [""]: no path matches, as in llama-server
    r = http.post("/infill", json=LLAMA_VIM_BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == set(LLAMA_VIM_BODY["response_fields"])
    assert isinstance(body["content"], str) and isinstance(body["truncated"], bool)
    assert all(isinstance(body[f"timings/{k}"], (int, float)) for k in TIMINGS)
    assert isinstance(body["timings/prompt_per_token_ms"], float) and body["timings/predicted_n"] <= 16
    assert body["tokens_cached"] > 0  # the warm-up put the extra context in the cache


def test_samplers_refused_with_one_line(http):
    for samplers, word in ((["temperature", "top_k"], "order"), (["top_k", "bogus"], "unknown sampler 'bogus'"),
                           (["infill", "top_k"], "order"), ("kpz", "unknown sampler letter 'z'")):
        r = http.post("/infill", json=dict(LLAMA_VIM_BODY, samplers=samplers))
        assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
        assert "\n" not in r.json()["error"]["message"]
    ok = http.post("/infill", json=dict(LLAMA_VIM_BODY, samplers="kpi", response_fields=["generation_settings"]))
    assert ok.json()["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]  # letters, as llama.cpp
    skipped = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    ok = http.post("/completion", json={"prompt": "a b c", "n_predict": 2, "samplers": skipped})
    assert ok.status_code == 200  # llama-server's full default list: the steps not implemented are skipped


# -- Continue ---------------------------------------------------------------------------------------------------

def test_continue_llamacpp_provider_streams_completion(http, name):
    body = {"model": name, "prompt": CONTINUE_PROMPT, "stream": True, "n_predict": 4096, "stop": CONTINUE_STOP,
            "temperature": 0.01}  # LlamaCpp._convertArgs drops what Continue leaves undefined
    with http.stream("POST", "/completion", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = _until_newline(json.loads(ln[6:]).get("content", "") for ln in r.iter_lines()
                              if ln.startswith("data: "))
    assert isinstance(text, str)
    assert http.get("/health").status_code == 200  # the hang-up cancelled the rest; the server goes on
    r = http.post("/completion", json=dict(body, stream=False, n_predict=8)).json()
    assert r["tokens_predicted"] <= 8 and r["stop_type"] in ("eos", "word", "limit")


def test_continue_openai_provider_streams_v1_completions(server, name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(model=name, prompt=CONTINUE_PROMPT, max_tokens=4096, temperature=0.01,
                                       stop=CONTINUE_STOP[:4], stream=True)
    text = _until_newline(ev.choices[0].text for ev in stream if ev.choices)
    stream.close()
    assert isinstance(text, str)
    done = client.completions.create(model=name, prompt=CONTINUE_PROMPT, max_tokens=6, temperature=0.01)
    n = done.usage.completion_tokens  # "length" exactly when max_tokens was reached
    assert n <= 6 and done.choices[0].finish_reason == ("length" if n == 6 else "stop")


def test_continue_ollama_provider_show_then_fim(http, server, name):
    ollama = pytest.importorskip("ollama")
    shown = http.post("/api/show", json={"name": name})  # Continue's body: the older `name` field
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert ".Suffix" in body["template"] and body["capabilities"] == ["completion", "tools", "insert"]
    params = {}
    for line in body["parameters"].split("\n"):  # Continue's parser, verbatim
        m = re.match(r'^(\S+)\s+((?:".*")|\S+)$', line)
        if m:
            params[m.group(1)] = m.group(2)
    assert int(params["num_ctx"]) == 2048
    client = ollama.Client(host=server.url)
    info = client.show(name)  # the ollama package: `model`, and ShowResponse's types
    assert info.template == body["template"] and info.details.format == "gguf" and info.modelinfo
    options = {"temperature": 0.01, "num_predict": 4096, "stop": CONTINUE_STOP, "num_ctx": 2048,
               "num_thread": None, "use_mmap": None, "num_gpu": None}
    chunks = client.generate(model=name, prompt=PREFIX + "        s += ", suffix=SUFFIX, options=options,
                             keep_alive=1800, stream=True)
    text = _until_newline(c.response for c in chunks)
    assert isinstance(text, str)
    done = client.generate(model=name, prompt=PREFIX, suffix=SUFFIX, keep_alive=1800, stream=False,
                           options={"num_predict": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "seed": 3})
    assert done.done and done.eval_count <= 5 and done.prompt_eval_count > 20
    raw = client.generate(model=name, prompt=CONTINUE_PROMPT, raw=True, keep_alive=1800, stream=False,
                          options={"num_predict": 5, "stop": CONTINUE_STOP, "num_ctx": 2048})
    assert raw.done and raw.eval_count <= 5  # Continue's non-FIM path: its template, raw
    assert client.show(name + ":latest").template == body["template"]
    missing = http.post("/api/show", json={"model": "nope"})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]


# -- seeded: the infill chain is lossless under speculation --------------------------------------------------------

@pytest.fixture(scope="module")
def others(fim_model, smollm2_f16_path) -> Iterator[dict[str, ServerProcess]]:
    procs: dict[str, ServerProcess] = {}
    try:
        for key, args in {"plain": ["--no-spec"], "lookup": ["--lookup", "--no-adaptive", "-k", "4"],
                          "model": ["--draft", str(smollm2_f16_path), "--no-adaptive", "-k", "3"]}.items():
            procs[key] = ServerProcess(["--model", str(fim_model), "--ctx", "2048", "--threads", "2",
                                        *args]).__enter__()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def test_seeded_infill_chain_same_text_with_and_without_speculation(others):
    """The infill step warps the drafter's rows as the target's: a seed gives plain decoding's text."""
    lines = [f"    t{i} = f(v[{i}])" for i in range(30)]
    vim = dict(LLAMA_VIM_BODY, input_prefix="\n".join(lines[:20]) + "\n", prompt="    t20 = f(v[",
               input_suffix="\n".join(lines[21:]) + "\n", seed=11, response_fields=["content", "timings/draft_n"],
               t_max_predict_ms=0)  # no time budget: a slower server (the model drafter's) would stop sooner
    story = {"prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
             "n_predict": 24, "samplers": ["top_k", "top_p", "infill", "temperature"], "top_k": 40, "top_p": 0.9,
             "temperature": 1.3, "seed": 5, "return_tokens": True}
    drafted = 0
    for path, body in (("/infill", vim), ("/completion", story)):
        answers = {}
        for key, srv in others.items():
            r = httpx.post(srv.url + path, json=body, timeout=120).json()
            answers[key] = (r["content"], r.get("tokens"))
            drafted += r["timings/draft_n"] if "timings/draft_n" in r else r["timings"]["draft_n"]
        assert answers["lookup"] == answers["plain"] == answers["model"], (path, answers)
        assert answers["plain"][0], path  # something was written: the infill step let text through
    assert drafted > 0


def test_samplers_chain_units():
    """The parse without a server: letters, aliases, skipped steps, the off values, where infill sits."""
    from localspec.sampling.params import SamplingParams
    from localspec.server.http import ApiError
    from localspec.server.request.samplers import parse_samplers

    class Vocab:
        eot = 2

        def piece(self, t: int) -> bytes:
            return b"x"

        def is_eog(self, t: int) -> bool:
            return t == 2

    base = SamplingParams(temperature=0.0, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1)
    assert parse_samplers(None) is None
    vim = parse_samplers(["top_k", "top_p", "infill"]).apply(base, Vocab())
    assert (vim.temperature, vim.top_k, vim.top_p, vim.min_p, vim.repeat_penalty) == (1.0, 40, 0.9, 0.0, 1.0)
    assert vim.infill is not None and not vim.infill.tempered and not vim.greedy
    assert parse_samplers("kpit").apply(base, Vocab()).greedy  # temperature 0 listed: greedy
    assert parse_samplers(["Top-K", "nucleus", "temp", "infill"]).apply(base, Vocab()).infill.tempered
    assert parse_samplers([]).apply(base, Vocab()).temperature == 1.0  # the warm-up: nothing but the draw
    assert parse_samplers(["dry", "top_k", "xtc"]).names == ["top_k"]
    for bad in (["top_p", "top_k"], ["infill", "min_p"], ["infill", "infill"], ["top_k", "top_k"], ["mirostat"]):
        with pytest.raises(ApiError):
            parse_samplers(bad)
