"""The rest of llama-server's API against a real `localspec serve` (embedded SmolLM2, prompt lookup),
driven by the real `openai` client and httpx: several choices, token endpoints and prompt forms, `n_probs` in
llama-server's shape, chat details, server facts and flags (`--alias` lists, `--tags`, `--host` lists, `-n`,
`--cors-origins`).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

ALIASES = ["smol", "chat-model"]
ORIGIN = "http://app.example:8080"
N_DEFAULT = 12  # -n: the default n_predict


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServerProcess]:
    with ServerProcess(["--ctx", "1024", "--threads", "2", "--lookup", "--alias", ",".join(ALIASES),
                        "--tags", "test,small", "-n", str(N_DEFAULT), "--host", "127.0.0.1,127.0.0.2",
                        "--cors-origins", ORIGIN]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _events(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]


HI = [{"role": "user", "content": "Write one short sentence about cats."}]


# -- several choices -----------------------------------------------------------------------------------------------

def test_chat_n_choices_with_the_openai_client(client):
    r = client.chat.completions.create(model="x", messages=HI, n=3, max_tokens=6, temperature=0.9, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content for c in r.choices)
    assert r.usage.completion_tokens <= 18 and r.usage.prompt_tokens > 0
    again = client.chat.completions.create(model="x", messages=HI, n=3, max_tokens=6, temperature=0.9, seed=11)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seeded
    single = client.chat.completions.create(model="x", messages=HI, max_tokens=6, temperature=0.9, seed=12)
    assert single.choices[0].message.content == r.choices[1].message.content  # choice j runs with seed + j


def test_chat_n_choices_streamed(client):
    chunks = list(client.chat.completions.create(model="x", messages=HI, n=2, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for c in chunks[:-1]:
        ch = c.choices[0]
        text[ch.index] += ch.delta.content or ""
        if ch.finish_reason:
            finished.add(ch.index)
    assert finished == {0, 1} and text[0] == text[1] != ""  # greedy: the same answer twice
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completions_list_of_prompts_times_n(client):
    r = client.completions.create(model="x", prompt=["1, 2, 3,", "a, b, c,"], n=2, max_tokens=3, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text


def test_n_cmpl_shares_the_prompt_kv_cache(http):
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    res = http.post("/completion", json={"prompt": prompt, "n_cmpl": 3, "n_predict": 4, "temperature": 0.8,
                                         "seed": 5}).json()
    assert [x["index"] for x in res] == [0, 1, 2]
    for later in res[1:]:  # the prompt is in the cache: only its last token is evaluated again
        assert later["timings"]["prompt_n"] == 1 and later["tokens_cached"] == later["tokens_evaluated"] - 1
    streamed = _events(http, "/completion", {"prompt": prompt, "n_cmpl": 2, "n_predict": 4, "temperature": 0.8,
                                             "seed": 5})
    finals = [e for e in streamed if e["stop"]]
    assert [e["index"] for e in finals] == [0, 1]
    for i in (0, 1):
        assert "".join(e["content"] for e in streamed if e["index"] == i) == res[i]["content"]


# -- token endpoints and prompt forms ---------------------------------------------------------------------------

def test_prompt_as_token_ids_mixed_and_several(http, client):
    text = "Once upon a time"
    ids = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    body = {"n_predict": 5, "temperature": 0}
    want = http.post("/completion", json={**body, "prompt": text}).json()["content"]
    assert http.post("/completion", json={**body, "prompt": ids}).json()["content"] == want
    mixed = http.post("/completion", json={**body, "prompt": ["Once upon", *ids[-2:]]}).json()
    assert mixed["tokens_evaluated"] == len(http.post("/tokenize", json={"content": ["Once upon", *ids[-2:]],
                                                                          "add_special": True}).json()["tokens"])
    several = http.post("/completion", json={**body, "prompt": [text, ids, "2, 4, 6,"]}).json()
    assert [x["index"] for x in several] == [0, 1, 2] and several[0]["content"] == several[1]["content"] == want
    r = client.completions.create(model="x", prompt=[ids, ids], max_tokens=5, temperature=0)
    assert [c.text for c in r.choices] == [want, want]
    assert http.post("/completion", json={**body, "prompt": []}).status_code == 400
    assert http.post("/completion", json={**body, "prompt": [1, [2]]}).status_code == 400


def test_tokenize_mixed_pieces_and_chat_input_tokens(http):
    r = http.post("/tokenize", json={"content": ["Hello", 28, " world"], "with_pieces": True}).json()["tokens"]
    assert r[0]["piece"] == "Hello" and r[1] == {"id": 28, "piece": ","} and r[-1]["piece"] == " world"
    prompt = http.post("/apply-template", json={"messages": HI}).json()["prompt"]
    n = http.post("/v1/chat/completions/input_tokens", json={"messages": HI}).json()
    assert n["input_tokens"] == len(http.post("/tokenize", json={"content": prompt}).json()["tokens"])
    assert http.post("/detokenize", json={"tokens": [10 ** 9]}).status_code == 400


# -- n_probs ----------------------------------------------------------------------------------------------------

def test_n_probs_post_sampling_shape(http):
    body = {"prompt": "1, 2, 3,", "n_predict": 4, "temperature": 0.7, "top_k": 20, "seed": 1, "n_probs": 3}
    pre = http.post("/completion", json=body).json()["completion_probabilities"]
    assert all("logprob" in p and len(p["top_logprobs"]) == 3 for p in pre)
    post = http.post("/completion", json={**body, "post_sampling_probs": True}).json()["completion_probabilities"]
    assert [p["id"] for p in post] == [p["id"] for p in pre]  # asking changes the report, not the text
    for p in post:
        assert "logprob" not in p and 0 < p["prob"] <= 1 and len(p["top_probs"]) <= 3
        assert sum(t["prob"] for t in p["top_probs"]) <= 1 + 1e-6
        assert p["top_probs"][0]["prob"] >= p["top_probs"][-1]["prob"]
    greedy = http.post("/completion", json={**body, "temperature": 0, "post_sampling_probs": True}).json()
    assert all(p["prob"] == 1.0 for p in greedy["completion_probabilities"])
    events = _events(http, "/completion", {**body, "post_sampling_probs": True, "return_tokens": True})
    streamed = [p for e in events if not e["stop"] for p in e.get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == [t for e in events for t in e["tokens"]] == [p["id"] for p in post]


# -- chat details -----------------------------------------------------------------------------------------------

def test_progress_and_timings_per_token(http):
    events = _events(http, "/completion", {"prompt": "Tell me a story.", "n_predict": 4, "temperature": 0,
                                           "return_progress": True, "timings_per_token": True})
    cached, prog = events[0]["prompt_progress"], events[1]["prompt_progress"]  # llama-server's: the cached part first
    assert cached["processed"] == cached["cache"] == prog["cache"] and cached["total"] == prog["total"]
    assert prog["total"] == prog["processed"] == events[-1]["tokens_evaluated"] and prog["time_ms"] >= 0
    assert all("timings" in e for e in events[2:])
    chat = _events(http, "/v1/chat/completions", {"messages": HI, "max_tokens": 3, "temperature": 0,
                                                  "return_progress": True, "timings_per_token": True})
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant", "content": None} and "prompt_progress" in chat[0]
    marks = [c["prompt_progress"] for c in chat if "prompt_progress" in c]  # the cached part, each batch, the whole
    assert marks[0]["processed"] == marks[0]["cache"] and marks[-1]["processed"] == marks[-1]["total"]
    assert all(a["processed"] < b["processed"] for a, b in zip(marks, marks[1:]))
    assert all("timings" in c for c in chat[len(marks):])


def test_assistant_prefill_and_continue_final_message(http, client):
    prefill = [*HI, {"role": "assistant", "content": "Cats are"}]
    prompt = http.post("/apply-template", json={"messages": prefill}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\nCats are")  # continued, not closed
    closed = http.post("/apply-template", json={"messages": prefill, "continue_final_message": False}).json()
    assert closed["prompt"].rstrip().endswith("<|im_start|>assistant")
    r = client.chat.completions.create(model="x", messages=prefill, max_tokens=4, temperature=0)
    plain = http.post("/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0}).json()
    assert r.choices[0].message.content == plain["content"]
    two = [*prefill, {"role": "assistant", "content": "more"}]
    bad = http.post("/v1/chat/completions", json={"messages": two})
    assert bad.status_code == 400 and "2 or more assistant" in bad.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json={"messages": HI, "continue_final_message": True}).status_code == 400


# -- server facts and flags -------------------------------------------------------------------------------------

def test_props_models_aliases_and_tags(http, client):
    p = http.get("/props").json()
    reported = min(ALIASES)  # llama-server keeps the aliases in a sorted set and reports the first
    assert p["model_alias"] == reported and p["total_slots"] == 1 and p["modalities"] == {"vision": False,
                                                                                             "audio": False}
    assert p["default_generation_settings"]["params"]["n_predict"] == N_DEFAULT
    assert p["default_generation_settings"]["n_ctx"] == 1024 and "<|im_start|>" in p["chat_template"]
    models = client.models.list().data
    assert [m.id for m in models] == [reported]
    assert models[0].model_extra["aliases"] == [reported, *(a for a in ALIASES if a != reported)]
    assert models[0].model_extra["tags"] == ["test", "small"]
    for name in ALIASES:  # Ollama's routes are strict about names: every alias is one
        assert http.post("/api/generate", json={"model": name, "prompt": "Hi", "stream": False,
                                                "options": {"num_predict": 2}}).status_code == 200


def test_n_is_the_default_not_a_cap(http):
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "temperature": 0}
    assert http.post("/completion", json=body).json()["tokens_predicted"] == N_DEFAULT
    assert http.post("/completion", json={**body, "n_predict": N_DEFAULT + 8}).json()["tokens_predicted"] > N_DEFAULT


def test_every_host_address_answers_and_metrics(http, server):
    assert httpx.get(server.url.replace("127.0.0.1", "127.0.0.2") + "/health", timeout=30).status_code == 200
    # the generation rate needs an answer first (in another test order, none came before this test)
    assert http.post("/completion", json={"prompt": "Hi", "n_predict": 4}).status_code == 200
    r = http.get("/metrics")
    assert int(r.headers["Process-Start-Time-Unix"]) > 1_600_000_000
    rate = [ln for ln in r.text.splitlines() if ln.startswith("llamacpp:predicted_tokens_seconds ")]
    assert float(rate[0].split()[1]) > 0


def test_cors_origins_flag(http):
    r = http.get("/v1/models", headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "access-control-allow-origin" not in http.get("/v1/models", headers={"Origin": "http://evil.example"}).headers
