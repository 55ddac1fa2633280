"""`localspec serve` on the embedded default model, driven by real clients: the `openai` and `ollama` packages
and raw HTTP with llama.vim's exact request body. SmolLM2 declares no FIM tokens, so FIM requests get a 400.
"""

from __future__ import annotations

import json

import httpx
import pytest
from servers import LLAMA_VIM_BODY, ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(smollm2_path):
    # threads pinned, as in test_rpc.py: a thread switch mid-answer may move a greedy near-tie token
    # (docs/design.md), which the streamed-vs-whole comparison below would see
    with ServerProcess(["--ctx", "1024", "--max-predict", "64", "--threads", "2"]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def model_name(http) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


def _error(r: httpx.Response, status: int, *needles: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    msg = body["error"] if isinstance(body["error"], str) else body["error"]["message"]
    for n in needles:
        assert n in msg, msg
    return msg


# -- OpenAI ------------------------------------------------------------------------------------------------------

def test_openai_completion_chat_and_stream(server, model_name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    c = client.completions.create(model=model_name, prompt="def fib(n):", max_tokens=12, temperature=0)
    assert c.choices[0].text and c.usage.completion_tokens <= 12 and c.usage.prompt_tokens > 0
    spec = c.model_extra["speculative"]
    assert spec["enabled"] == (spec["draft_n"] > 0) and spec["drafter"] == "lookup"  # enabled: drafts were made
    t = c.model_extra["timings"]  # the llama.cpp timings and our speculative block count the same drafts
    assert (t["draft_n"], t["draft_n_accepted"]) == (spec["draft_n"], spec["draft_n_accepted"])
    assert t["draft_n_accepted"] <= t["draft_n"]

    chat = client.chat.completions.create(model=model_name, max_tokens=12, temperature=0,
                                          messages=[{"role": "user", "content": "Say hello."}])
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    # "length" exactly when max_tokens was reached, "stop" (end of turn) otherwise
    assert chat.choices[0].finish_reason == ("length" if chat.usage.completion_tokens == 12 else "stop")

    pieces, finish, extra, usage = [], None, None, None
    for ev in client.chat.completions.create(model=model_name, max_tokens=12, temperature=0, stream=True,
                                             messages=[{"role": "user", "content": "Say hello."}]):
        if ev.choices and ev.choices[0].delta.content:
            pieces.append(ev.choices[0].delta.content)
        if ev.choices and ev.choices[0].finish_reason:
            finish, extra, usage = ev.choices[0].finish_reason, ev.model_extra, ev.usage
    assert "".join(pieces) == chat.choices[0].message.content  # greedy, same prompt, warm cache
    assert finish == chat.choices[0].finish_reason and usage.completion_tokens == chat.usage.completion_tokens
    assert "speculative" in extra


def test_openai_sse_ends_with_done(http, model_name):
    with http.stream("POST", "/v1/completions", json={"model": model_name, "prompt": "1, 2, 3,", "max_tokens": 8,
                                                       "temperature": 0, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][6:])
    assert final["choices"][0]["finish_reason"] == "length" and "speculative" in final  # counting on past 8 tokens


def test_openai_suffix_without_fim_tokens_is_a_clear_400(server, model_name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="declares no FIM tokens"):
        client.completions.create(model=model_name, prompt="def f(", suffix="\n", max_tokens=4)


def test_openai_any_model_name_is_served(server, model_name):
    """llama-server and LM Studio serve the loaded model whatever `model` says; the response names it."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="gpt-9", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert r.model == model_name and r.choices[0].message.content is not None


# -- Ollama ------------------------------------------------------------------------------------------------------

def test_ollama_generate_chat_tags(server, model_name):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url)
    tags = client.list()
    assert [m.model for m in tags.models] == [model_name]
    r = client.generate(model=model_name, prompt="Count: 1, 2, 3,", options={"temperature": 0, "num_predict": 8},
                        stream=False)
    assert r.done and r.response and r.eval_count <= 8
    assert r.prompt_eval_count > 0 and r.eval_duration > 1000 and r.total_duration >= r.eval_duration  # ns
    parts = list(client.chat(model=model_name, messages=[{"role": "user", "content": "Say hi."}],
                             options={"temperature": 0, "num_predict": 8}, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts)
    with httpx.stream("POST", server.url + "/api/generate", json={"model": model_name, "prompt": "1, 2, 3,",
                                                                 "options": {"num_predict": 6}},
                      timeout=120) as raw:
        assert raw.headers["content-type"].startswith("application/x-ndjson")  # streaming is the default
        objs = [json.loads(ln) for ln in raw.iter_lines() if ln]
    assert objs[-1]["done"] is True and objs[-1]["speculative"]["drafter"] == "lookup"
    assert isinstance(objs[-1]["eval_duration"], int)
    with pytest.raises(ollama.ResponseError, match="declares no FIM tokens") as e:
        client.generate(model=model_name, prompt="def f(", suffix="\n", stream=False)
    assert e.value.status_code == 400
    assert httpx.get(server.url + "/api/version", timeout=60).json()["version"]


# -- llama.cpp ---------------------------------------------------------------------------------------------------

def test_llama_vim_body_on_a_model_without_fim_is_a_clear_400(http):
    _error(http.post("/infill", json=LLAMA_VIM_BODY), 400, "declares no FIM tokens")


def test_completion_sse_final_chunk_has_timings(http):
    with http.stream("POST", "/completion", json={"prompt": "a b c a b c a b", "n_predict": 12,
                                                   "temperature": 0, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    t = events[-1]["timings"]
    assert {"draft_n", "draft_n_accepted", "predicted_n", "prompt_n", "predicted_per_second"} <= set(t)
    assert t["predicted_n"] == events[-1]["tokens_predicted"] <= 12
    spec = events[-1]["speculative"]  # (the adaptive controller may choose not to draft)
    assert (t["draft_n"], t["draft_n_accepted"]) == (spec["draft_n"], spec["draft_n_accepted"])
    assert t["draft_n_accepted"] <= t["draft_n"] and spec["enabled"] == (t["draft_n"] > 0)


def test_health_props_metrics(http):
    assert http.get("/health").json() == {"status": "ok"}
    p = http.get("/props").json()
    assert p["n_ctx"] == 1024 and p["drafter"] == "lookup" and p["fim"] is False
    m = http.get("/metrics").text
    assert "localspec_draft_n_total" in m and "localspec_speculation_enabled 1" in m
    assert 'localspec_requests_total{route="/completion"}' in m


# -- bad input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,body,status,needle", [
    ("/completion", b"{not json", 400, "malformed JSON"),
    ("/completion", b'{"prompt": 5}', 400, "prompt"),
    ("/completion", b'{"prompt": "x", "n_predict": -5}', 400, "n_predict"),
    ("/completion", b'{"prompt": "x", "n_predict": 1000000000}', 400, "n_predict"),
    ("/completion", b'{"prompt": [999999]}', 400, "token ids"),
    ("/completion", b'{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
    ("/completion", json.dumps({"prompt": "word " * 1500, "n_predict": 4}).encode(), 400, "context size"),
    ("/infill", b'{"input_extra": [{"filename": "a.py"}]}', 400, "input_extra"),
    ("/infill", b'{"input_extra": [{"text": 5}]}', 400, "input_extra"),
    ("/infill", b'{"input_extra": [{"text": "x", "filename": 1}]}', 400, "filename"),
    ("/infill", b'{"input_extra": "x"}', 400, "input_extra"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 17}', 400, "n: "),
    ("/completion", b'{"prompt": "x", "json_schema": {"type": "nonsense"}}', 400, "JSON schema"),
    ("/completion", b'{"prompt": "x", "grammar": "root ::= undefined-rule"}', 400, "grammar"),
    ("/completion", b'{"prompt": "x", "logit_bias": [[99999999, 1]]}', 400, "vocabulary"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', 400,
     "logprobs: true"),
    ("/v1/chat/completions", b'{"model": "x", "messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
    ("/api/generate", b'{"model": "llama3", "prompt": "x"}', 404, "not found"),
    ("/api/generate", b'[1, 2]', 400, ""),
    ("/nope", b"{}", 404, "no route"),
])
def test_bad_input_is_4xx_json(http, path, body, status, needle):
    _error(http.post(path, content=body, headers={"content-type": "application/json"}), status, needle)


def test_server_survives_bad_input(http):
    for body in (b"{not json", b'{"prompt": [999999]}', b'{"prompt": "x", "grammar": "root ::= undefined-rule"}'):
        assert http.post("/completion", content=body, headers={"content-type": "application/json"}).status_code == 400
    r = http.post("/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] <= 4


def test_n_predict_capped_by_max_predict(http):
    r = http.post("/completion", json={"prompt": "1 2 3 4 5 6 7 8 9", "n_predict": -1, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] <= 64


def test_n_predict_above_the_context_runs_until_a_limit(http):
    """llama-server runs to EOS or a full context instead of refusing (here --max-predict 64 is the limit)."""
    r = http.post("/completion", json={"prompt": "1 2 3 4 5 6 7 8 9", "n_predict": 5000, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] <= 64
    r = http.post("/v1/completions", json={"prompt": "1 2 3 4 5", "max_tokens": 100000, "temperature": 0})
    body = r.json()  # the --max-predict cap ends it as "length", an end of text as "stop"
    assert r.status_code == 200
    assert body["choices"][0]["finish_reason"] == ("length" if body["usage"]["completion_tokens"] == 64 else "stop")


def test_prompt_over_the_context_is_exceed_context_size_error(http):
    r = http.post("/completion", json={"prompt": "word " * 1500, "n_predict": 4})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024
