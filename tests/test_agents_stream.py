"""A long prompt's stream begins at once: every streaming route sends its head and opening event before the
prefill, then its keep-alive (or llama-server's `prompt_progress`) while the prompt is read.

The server runs in this process (uvicorn on port 0, a thread) over SmolLM2 whose prefill batches are slowed
down: each full batch of 64 tokens sleeps first, so a prompt of some hundred tokens takes seconds to read on
any machine, and the keep-alive interval is shortened to half a second. Deadlines here are generous ones that
catch a stream waiting for its prefill, not speed limits.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx
import pytest
from inprocess import load, serving

from localspec.server.execution import run as run_module

pytestmark = pytest.mark.slow

SLOW_S = 0.6  # each full prefill batch's delay
N_BATCH = 64
KEEPALIVE_S = 0.5
FIRST_BYTE_S = 1.0  # the deadline for the head and the opening event


@pytest.fixture(scope="module")
def url(smollm2_path) -> Iterator[str]:
    engine = load(smollm2_path, n_batch=N_BATCH)
    decode = engine.target.decode

    def slow(tokens, logits_rows=1):
        if len(tokens) == N_BATCH:  # a full prefill batch (a verify round here has at most 4 tokens)
            time.sleep(SLOW_S)
        return decode(tokens, logits_rows)

    engine.target.decode = slow
    with serving(engine) as url:
        yield url


@pytest.fixture(autouse=True)
def short_keepalive(monkeypatch) -> None:
    monkeypatch.setattr(run_module, "KEEPALIVE_S", KEEPALIVE_S)


_n = 0


def long_text() -> str:
    """About 450 tokens, with a head no earlier request had: the whole prompt is prefilled anew."""
    global _n
    _n += 1
    return f"Request {_n} at {time.time()}. " + "The quick brown fox jumps over the lazy dog. " * 45


def timed_lines(url: str, body: dict[str, Any]) -> tuple[int, float, list[tuple[float, str]]]:
    """(status, seconds to the head, [(seconds, line)] for every non-empty line of the body)."""
    t0 = time.perf_counter()
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        head = time.perf_counter() - t0
        lines = [(time.perf_counter() - t0, ln) for ln in r.iter_lines() if ln]
    return r.status_code, head, lines


def first_token(lines: list[tuple[float, str]], is_token) -> int:
    return next(i for i, (_, ln) in enumerate(lines) if is_token(ln))


def data(ln: str) -> dict[str, Any] | None:
    return json.loads(ln[6:]) if ln.startswith("data: {") else None


def check(status: int, head: float, lines: list[tuple[float, str]], opening: str | None, until: int) -> None:
    """The head (and the opening line) within the deadline; the prefill took seconds, and no gap before the
    first token was longer than a few keep-alive intervals."""
    assert status == 200
    assert head < FIRST_BYTE_S, head
    if opening is not None:
        assert lines[0][1].startswith(opening) and lines[0][0] < FIRST_BYTE_S, lines[:2]
    waited = [t for t, _ in lines[:until + 1]]
    assert waited[-1] > 4 * KEEPALIVE_S, "the prefill was not slow: the test shows nothing"
    gaps = [b - a for a, b in zip([head, *waited], waited)]
    assert max(gaps) < 4 * KEEPALIVE_S, gaps


def test_anthropic_sends_message_start_then_pings(url):
    body = {"model": "m", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": long_text()}]}
    status, head, lines = timed_lines(url + "/v1/messages", body)
    until = first_token(lines, lambda ln: ln.startswith("event: content_block_delta"))
    check(status, head, lines, "event: message_start", until)
    start = data(lines[1][1])
    assert start is not None and start["message"]["usage"]["input_tokens"] > 400  # known before the prefill
    assert sum(ln == "event: ping" for _, ln in lines[:until]) >= 3


def test_responses_sends_created_then_comments(url):
    body = {"input": long_text(), "max_output_tokens": 4, "stream": True}
    status, head, lines = timed_lines(url + "/v1/responses", body)
    until = first_token(lines, lambda ln: ln.startswith("event: response.output_text.delta"))
    check(status, head, lines, "event: response.created", until)
    assert sum(ln == ": keep-alive" for _, ln in lines[:until]) >= 3


def test_responses_progress_with_timings(url):
    body = {"input": long_text(), "max_output_tokens": 4, "stream": True, "return_progress": True,
            "timings_per_token": True}
    status, head, lines = timed_lines(url + "/v1/responses", body)
    events = [e for _, ln in lines if (e := data(ln)) is not None]
    marks = [e for e in events if "prompt_progress" in e]
    assert len(marks) >= 7  # one a batch of 64 tokens
    p = [m["prompt_progress"] for m in marks]
    assert p[0]["processed"] == p[0]["cache"] and p[-1]["processed"] == p[-1]["total"] > 400
    t = [m["timings"] for m in marks]
    assert t[0]["prompt_n"] == 0 and t[0]["predicted_n"] == 0  # llama-server's: before any prompt token
    assert all(a["prompt_ms"] <= b["prompt_ms"] and a["prompt_n"] < b["prompt_n"] for a, b in zip(t, t[1:]))


def test_openai_chat_and_completions(url):
    chat = {"messages": [{"role": "user", "content": long_text()}], "max_tokens": 4, "stream": True}
    status, head, lines = timed_lines(url + "/v1/chat/completions", chat)
    until = first_token(lines, lambda ln: (d := data(ln)) is not None and bool(d["choices"]) and
                        bool(d["choices"][0]["delta"].get("content")))
    check(status, head, lines, "data: ", until)
    assert data(lines[0][1])["choices"][0]["delta"]["role"] == "assistant"  # type: ignore[index]
    assert sum(ln == ": keep-alive" for _, ln in lines[:until]) >= 3
    status, head, lines = timed_lines(url + "/v1/completions", {"prompt": long_text(), "max_tokens": 4,
                                                                "stream": True})
    until = first_token(lines, lambda ln: ln.startswith("data: {"))
    check(status, head, lines, ": keep-alive", until)  # OpenAI's completions have no opening event


def test_llama_server_completion_progress_at_once(url):
    body = {"prompt": long_text(), "n_predict": 4, "stream": True, "return_progress": True}
    status, head, lines = timed_lines(url + "/completion", body)
    until = first_token(lines, lambda ln: (d := data(ln)) is not None and "prompt_progress" not in d)
    check(status, head, lines, "data: ", until)
    assert "prompt_progress" in data(lines[0][1])  # type: ignore[operator]


def test_ollama_chat_sends_empty_pieces(url):
    name = httpx.get(url + "/api/tags").json()["models"][0]["name"]
    body = {"model": name, "messages": [{"role": "user", "content": long_text()}], "options": {"num_predict": 4}}
    status, head, lines = timed_lines(url + "/api/chat", body)
    objs = [json.loads(ln) for _, ln in lines]
    until = next(i for i, o in enumerate(objs) if o["message"]["content"] or o["done"])
    check(status, head, lines, "{", until)
    assert all(o["message"]["content"] == "" and not o["done"] for o in objs[:until]) and until >= 3


def test_a_prompt_that_does_not_fit_is_still_a_400(url):
    body = {"model": "m", "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": long_text() * 5}]}
    with httpx.stream("POST", url + "/v1/messages", json=body, timeout=60) as r:
        assert r.status_code == 400
        assert "exceeds the available context size" in json.loads(r.read())["error"]["message"]
