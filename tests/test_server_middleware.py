"""The app's ASGI middleware (API key, CORS, held heads) on a stub ASGI app, and the /metrics text: pure, no model."""

from __future__ import annotations

import asyncio

from localspec.server.app import ApiKeyMiddleware, CorsMiddleware
from localspec.server.http import HeldHeads


async def _call(app, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    await app({"type": "http", "path": path, "method": "GET", "headers": headers}, receive, send)
    return sent[0]["status"]


async def test_api_key_middleware():
    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = ApiKeyMiddleware(ok_app, key="s3cret")
    assert await _call(app, "/health", []) == 200
    assert await _call(app, "/v1/models", []) == 401
    assert await _call(app, "/v1/models", [(b"authorization", b"Bearer wrong")]) == 401
    assert await _call(app, "/v1/models", [(b"authorization", b"Bearer s3cret")]) == 200
    assert await _call(app, "/api/tags", [(b"x-api-key", b"s3cret")]) == 200


async def test_cors_preflight_comes_before_the_api_key():
    """Browsers send no Authorization on a preflight: it must be answered (200), not 401 or 405."""
    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = CorsMiddleware(ApiKeyMiddleware(ok_app, key="s3cret"))
    sent: list[dict] = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    headers = [(b"origin", b"http://localhost:8080"), (b"access-control-request-method", b"POST")]
    await app({"type": "http", "path": "/v1/chat/completions", "method": "OPTIONS", "headers": headers},
              receive, send)
    start = sent[0]
    assert start["status"] == 200
    assert (b"access-control-allow-origin", b"http://localhost:8080") in start["headers"]
    want = {(b"access-control-allow-credentials", b"true"), (b"access-control-allow-headers", b"*"),
            (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS")}
    assert want <= set(start["headers"])  # llama-server's preflight headers
    assert await _call(app, "/v1/models", [(b"origin", b"http://localhost:8080")]) == 401  # the key still rules
    sent.clear()
    await CorsMiddleware(ok_app)({"type": "http", "path": "/v1/models", "method": "GET",
                                  "headers": [(b"origin", b"http://127.0.0.1:3000")]}, receive, send)
    assert want | {(b"access-control-allow-origin", b"http://127.0.0.1:3000")} <= set(sent[0]["headers"])


async def test_a_runner_sends_a_streams_head_with_its_first_piece():
    """Behind the router, the head waits for the first piece (the router then wakes once, at the first token);
    the order and content of the messages are unchanged, and a whole answer is as it was."""
    events: list[str] = []
    first_piece = asyncio.Event()

    async def streaming_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        events.append("app: head")
        await first_piece.wait()  # the prompt's evaluation
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        events.append(msg["type"])

    call = asyncio.ensure_future(HeldHeads(streaming_app)({"type": "http", "path": "/infill", "method": "POST",
                                                            "headers": []}, receive, send))
    await asyncio.sleep(0.01)
    assert events == ["app: head"]  # nothing reached the socket yet
    first_piece.set()
    await call
    assert events == ["app: head", "http.response.start", "http.response.body", "http.response.body"]


def test_cors_origin_rules():
    local = CorsMiddleware(None)
    assert local.allow("http://localhost:5173") == "http://localhost:5173"
    assert local.allow("http://[::1]:80") == "http://[::1]:80" and local.allow("http://app.localhost")
    assert local.allow("https://example.com") is None and local.allow("") is None
    assert CorsMiddleware(None, "*").allow("https://example.com") == "https://example.com"  # echoed, not "*"
    listed = CorsMiddleware(None, "https://a.example, https://b.example")
    assert listed.allow("https://b.example") and listed.allow("https://c.example") is None


def test_metrics_text_has_the_promised_series():
    from localspec.server.execution.metrics import Metrics

    text = Metrics().render(speculation_enabled=True, queue_waiting=0, busy=False)
    for name in ("localspec_requests_total", "llamacpp:tokens_predicted_total", "localspec_draft_n_total",
                 "localspec_draft_n_accepted_total", "localspec_acceptance_rate",
                 "localspec_tokens_per_second_bucket", "localspec_speculation_enabled 1"):
        assert name in text


async def test_cors_wildcard_echoes_the_origin():
    """`--cors-origins '*'`: browsers refuse `Access-Control-Allow-Origin: *` with credentials allowed, so the
    request's own origin is sent back, as llama-server does."""
    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[dict] = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    origin = (b"origin", b"https://app.example.com")
    for method in ("OPTIONS", "GET"):
        sent.clear()
        await CorsMiddleware(ok_app, origins="*")({"type": "http", "path": "/v1/models", "method": method,
                                                   "headers": [origin]}, receive, send)
        headers = dict(sent[0]["headers"])
        assert headers[b"access-control-allow-origin"] == b"https://app.example.com"
        assert headers[b"access-control-allow-credentials"] == b"true"


def test_the_build_id_has_llama_cpps_shape():
    """llama-server's system_fingerprint and /props build_info read `b<build>-<commit>` (clients check the b)."""
    import re

    from localspec.backend import llama_build

    assert re.fullmatch(r"b\d+-\w+", llama_build())


def test_one_token_has_no_generation_rate():
    """llama-server's first token costs no generation step: with one token the rate and per-token time are 0."""
    from localspec.engine.stats import Stats
    from localspec.server.execution.timings import timings

    one = Stats(n_prompt=4, prompt_ms=10.0, n_generated=1, gen_ms=0.001, rounds=1)
    t = timings(one)
    assert t["predicted_n"] == 1 and t["predicted_per_second"] == 0.0 and t["predicted_per_token_ms"] == 0.0
    more = Stats(n_prompt=4, prompt_ms=10.0, n_generated=16, gen_ms=40.0, rounds=16)
    t = timings(more)  # llama.cpp's test_metrics_generation_rate_excludes_first_token: 15 steps for 16 tokens
    assert t["predicted_per_second"] == 1e3 / t["predicted_ms"] * 15 and t["predicted_per_token_ms"] == 40.0 / 15
