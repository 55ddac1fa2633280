"""What llama-server and OpenAI clients depend on, driven by the real `openai` package and raw HTTP against a real
`localspec serve` (embedded SmolLM2, prompt lookup as the drafter, `--alias`): model names, log-probabilities,
structured output with speculation on, stream usage, /completion's llama-server fields, /tokenize and friends,
CORS, and /metrics' llama-server series.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

ALIAS = "smol-served"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "count"],
          "properties": {"color": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}}}
JSON_PROMPT = 'Answer in JSON like {"color": "red", "count": 3}. Which color is the sky, and how many suns are there?'


@pytest.fixture(scope="module")
def server(smollm2_path):
    # γ pinned with the controller off (`--no-adaptive`): structured output must be shown verified with drafts in
    # it, and an adaptive controller on this machine may rightly decide a short JSON answer is not worth drafting
    with ServerProcess(["--ctx", "1024", "--max-predict", "96", "--alias", ALIAS, "-k", "4", "--no-adaptive"]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# -- OpenAI, with the real client --------------------------------------------------------------------------------

def test_any_model_name_is_served_and_the_alias_is_reported(client, http):
    assert [m.id for m in client.models.list().data] == [ALIAS]
    for name in ("gpt-3.5-turbo", "davinci-002", "qwen2.5-coder:7b"):
        r = client.completions.create(model=name, prompt="1, 2, 3,", max_tokens=3, temperature=0)
        assert r.model == ALIAS and re.fullmatch(r"b\d+-\w+", r.system_fingerprint or "") and r.choices[0].text
    assert http.get("/api/tags").json()["models"][0]["name"] == ALIAS
    assert http.post("/api/generate", json={"model": "llama3", "prompt": "x"}).status_code == 404  # Ollama: strict


def test_chat_logprobs_come_with_every_token(client):
    r = client.chat.completions.create(model="x", max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
                                       messages=[{"role": "user", "content": "Say hello."}])
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.logprob  # greedy: the chosen token is the most likely one
        assert t.top_logprobs[0].token == t.token
    plain = client.chat.completions.create(model="x", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert plain.choices[0].logprobs is None
    assert_same_or_near_tie(content, plain.choices[0].message.content)  # asking for logprobs changes nothing


# nats. A 1-row decode and a batched verify differ by up to 0.19 nats in a top-3 token's log-probability
# (SmolLM2 Q4_1, measured on a 2-core x86 CPU); two tokens can move apart by twice that.
NEAR_TIE = 0.5


def assert_same_or_near_tie(content, text: str) -> None:
    """`text` is the answer `content` (a greedy run's tokens with their top log-probabilities) spells, or one
    that leaves it where the target was at a tie. The two runs are the same greedy decoding, but the lookup
    drafter remembers earlier answers, so their verify passes batch different drafts, and a CPU's logits differ
    in the last bits between batch shapes (docs/design.md, Numerics): a near-tie may go the other way, and only
    one may. Seen on another CPU: "...to my world!" and "...to my world." after 7 equal tokens."""
    said = ""
    for t in content:
        if not text.startswith(said + t.token):
            if len(text) <= len(said):
                break  # the other answer stopped here (length: same token count, shorter text)
            alts = [a for a in t.top_logprobs[1:]
                    if text.startswith(said + a.token) or (said + a.token).startswith(text)]
            assert alts, f"{text!r} leaves {said + t.token!r} for a token not among the top {len(t.top_logprobs)}"
            assert t.logprob - alts[0].logprob < NEAR_TIE, (t.token, alts[0].token, t.logprob, alts[0].logprob)
            return
        said += t.token
    assert said.startswith(text), (said, text)


def test_completion_logprobs_legacy_shape(client):
    r = client.completions.create(model="x", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens).startswith(r.choices[0].text) and lp.text_offset[0] == 0
    assert all(len(d) == 2 for d in lp.top_logprobs)


def test_structured_output_matches_the_schema_with_speculation_on(client):
    r = client.chat.completions.create(
        model="x", max_tokens=64, temperature=0, messages=[{"role": "user", "content": JSON_PROMPT}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}})
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"color", "count"} and obj["color"] in ("red", "green", "blue")
    assert isinstance(obj["count"], int)
    spec = r.model_extra["speculative"]
    assert spec["enabled"] is True and spec["draft_n"] > 0, spec  # drafts were made and verified
    assert r.choices[0].finish_reason == "stop"


def test_json_object_and_sampled_structured_output(client):
    for seed in (1, 2):
        r = client.chat.completions.create(
            model="x", max_tokens=96, temperature=0.8, seed=seed, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": JSON_PROMPT}])
        if r.choices[0].finish_reason == "stop":  # a sampled object may still be open at max_tokens
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:
            assert r.choices[0].message.content.lstrip().startswith("{")


def test_include_usage_adds_a_final_chunk_without_choices(client):
    chunks = list(client.chat.completions.create(model="x", max_tokens=6, temperature=0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "Say hi."}]))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].model_extra["timings"]["predicted_n"] == chunks[-1].usage.completion_tokens  # llama-server's
    usage = chunks[-1].usage  # cached: the prompt tokens an earlier request left in the cache, at most all of them
    assert 0 <= usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == ("length" if usage.completion_tokens == 6 else "stop")


def test_logit_bias_is_applied(client, http):
    body = {"prompt": "1, 2, 3,", "n_predict": 1, "temperature": 0, "return_tokens": True}
    first = http.post("/completion", json=body).json()["tokens"][0]
    banned = client.completions.create(model="x", prompt="1, 2, 3,", max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100}, logprobs=0)
    assert banned.choices[0].logprobs.model_extra["content"][0]["id"] != first
    assert http.post("/completion", json=body | {"logit_bias": [[first, False]]}).json()["tokens"][0] != first


# -- llama.cpp -----------------------------------------------------------------------------------------------------

def test_completion_has_tokens_prompt_and_generation_settings(http):
    r = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 6, "temperature": 0,
                                       "return_tokens": True, "n_probs": 2}).json()
    assert len(r["tokens"]) == r["tokens_predicted"] > 0
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["content"] == r["content"]
    assert r["prompt"] == "Once upon a time" and r["model"] == ALIAS
    gs = r["generation_settings"]
    assert gs["temperature"] == 0 and gs["n_predict"] == 6 and gs["top_k"] == 40 and gs["n_probs"] == 2
    assert gs["repeat_penalty"] == 1.0 and gs["repeat_last_n"] == 64  # the penalties are sampling parameters too
    probs = r["completion_probabilities"]
    assert [p["id"] for p in probs] == r["tokens"] and all(len(p["top_logprobs"]) == 2 for p in probs)


def test_streamed_tokens_per_chunk(http):
    """Each stream chunk carries its token ids without `return_tokens` (llama-server's stream always does)."""
    with http.stream("POST", "/completion", json={"prompt": "Once upon a time", "n_predict": 6, "temperature": 0,
                                                   "stream": True}) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    streamed = [t for e in events[:-1] for t in e["tokens"]]
    assert len(streamed) == events[-1]["tokens_predicted"] > 0
    assert "".join(e["content"] for e in events[:-1]) == http.post("/detokenize", json={"tokens": streamed}).json()[
        "content"]


def test_grammar_constrains_completion(http):
    r = http.post("/completion", json={"prompt": "Is the sky blue? Answer:", "n_predict": 8, "temperature": 0,
                                       "grammar": 'root ::= " yes" | " no"'}).json()
    assert r["content"] in (" yes", " no") and r["stop_type"] == "eos"


def test_tokenize_detokenize_round_trip(http):
    text = "Hello wörld, ünïcode 🦙!"
    toks = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert all(isinstance(t, int) for t in toks)
    assert http.post("/detokenize", json={"tokens": toks}).json()["content"] == text
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    tpl = http.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
    assert "hi" in tpl and "<|im_start|>" in tpl


def test_cors_preflight_and_localhost_origins(http):
    pre = http.options("/v1/chat/completions", headers={"Origin": "http://localhost:5173",
                                                        "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = http.get("/v1/models", headers={"Origin": "http://127.0.0.1:3000"})
    assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
    assert "access-control-allow-origin" not in http.get("/v1/models", headers={"Origin": "https://evil.example"}).headers


def test_metrics_llamacpp_series_and_start_time_header(http):
    http.post("/completion", json={"prompt": "a b c a b c a b", "n_predict": 8, "temperature": 0})
    r = http.get("/metrics")
    assert int(r.headers["Process-Start-Time-Unix"]) > 1_600_000_000
    names = {ln.split()[0].split("{")[0] for ln in r.text.splitlines() if ln and not ln.startswith("#")}
    assert {"llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total",
            "llamacpp:tokens_predicted_seconds_total", "llamacpp:prompt_tokens_seconds",
            "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing", "llamacpp:requests_deferred",
            "llamacpp:kv_cache_usage_ratio", "llamacpp:spec_decode_num_draft_tokens_total",
            "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_drafts_total"} <= names
