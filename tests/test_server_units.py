"""Pure parts of the server: the FIM layout, the n_indent rule, response_fields, the API-key middleware, metrics."""

from __future__ import annotations

import pytest

from localspec.engine.engine import Chunk
from localspec.engine.stats import Stats
from localspec.server.app import ApiKeyMiddleware, CorsMiddleware
from localspec.server.fim import (
    CURRENT_FILE,
    REPO_NAME,
    SNIPPET_SEPARATOR,
    Extra,
    FimTokens,
    FimUnsupported,
    build_infill,
    indent_cut,
    require_fim,
)
from localspec.server.llamacpp import EditorRules, _project
from localspec.server.schemas import InfillRequest
from localspec.speculative.types import Step

PRE, SUF, MID, REP, SEP, BOS = 901, 902, 903, 904, 905, 1


def tok(s: str) -> list[int]:
    """A fake tokenizer: one token per character."""
    return [ord(c) for c in s]


def test_fim_tokens_from_metadata_new_and_old_keys():
    meta = {"tokenizer.ggml.fim_pre_token_id": "10", "tokenizer.ggml.fim_suf_token_id": "11",
            "tokenizer.ggml.fim_mid_token_id": "12"}
    assert FimTokens.from_metadata(meta) == FimTokens(10, 11, 12)
    old = {"tokenizer.ggml.prefix_token_id": 1, "tokenizer.ggml.suffix_token_id": 2,
           "tokenizer.ggml.middle_token_id": 3, "tokenizer.ggml.fim_sep_token_id": "-1"}
    assert FimTokens.from_metadata(old) == FimTokens(1, 2, 3)
    assert FimTokens.from_metadata({"tokenizer.ggml.fim_pre_token_id": "10"}) is None
    with pytest.raises(FimUnsupported, match="declares no FIM tokens"):
        require_fim({}, "m")


def test_psm_layout_with_prompt_and_bos():
    p = build_infill(FimTokens(PRE, SUF, MID), tok, prefix="ab", suffix="yz", prompt="c", bos=BOS, n_ctx=4096)
    assert p.tokens == [BOS, PRE, *tok("ab"), SUF, *tok("yz"), MID, *tok("c")]  # the prompt after FIM_MID
    assert not p.truncated


def test_extra_chunks_without_repo_tokens_use_snippet_separator():
    p = build_infill(FimTokens(PRE, SUF, MID), tok, prefix="p", suffix="s", extra=[Extra("X", "a.py")], n_ctx=4096)
    assert p.tokens == [*tok(SNIPPET_SEPARATOR + "X"), PRE, *tok("p"), SUF, *tok("s"), MID]


def test_repo_level_form():
    fim = FimTokens(PRE, SUF, MID, REP, SEP)
    p = build_infill(fim, tok, prefix="p", suffix="s", extra=[Extra("X", "a.py"), Extra("Y", "b.py")], n_ctx=4096)
    extra = ([REP, *tok(REPO_NAME), SEP, *tok("a.py\n"), *tok("X"), SEP, *tok("b.py\n"), *tok("Y"),
              SEP, *tok(CURRENT_FILE)])
    assert p.tokens == extra + [PRE, *tok("p"), SUF, *tok("s"), MID]


def test_budgets_keep_the_end_of_the_prefix_and_the_start_of_the_suffix():
    fim = FimTokens(PRE, SUF, MID)
    p = build_infill(fim, tok, prefix="a" * 100 + "END", suffix="START" + "b" * 100, n_ctx=64, n_batch=32)
    assert p.truncated
    body = p.tokens
    pre = body[1:body.index(SUF)]
    suf = body[body.index(SUF) + 1:-1]
    assert len(pre) == 24 and "".join(map(chr, pre)).endswith("END")
    assert len(suf) == 6 and "".join(map(chr, suf)) == "STARTb"


@pytest.mark.parametrize("text,n,cut", [
    ("x = 1\n    y = 2\n", 4, None),
    ("x = 1\n    y = 2\nz = 3", 4, 16),
    ("x = 1\n\n    y", 4, None),  # empty lines do not stop
    ("x = 1\n  ", 4, None),  # the line has no content yet
    ("x\nz", 0, None),  # n_indent 0 = off
])
def test_indent_cut(text, n, cut):
    assert indent_cut(text, n) == cut


def test_t_max_predict_ms_stops_upon_a_newline_generated_over_budget():
    """llama-server's rule: a newline before the budget runs out does not stop; once over, the next newline
    does, and it is kept (whole lines), the rest of that round dropped."""
    def at(text: str, ms: float) -> Chunk:
        return Chunk(text, Step(tokens=(1,), drafted=0, accepted=0, t_draft=0.0, t_verify=0.0), Stats(gen_ms=ms))

    rules = EditorRules(InfillRequest(t_max_predict_ms=250, n_indent=0))
    assert rules.push(at("def f():\n", 100)) == ("def f():\n", "none")
    assert rules.push(at("    return", 260)) == ("    return", "none")  # over budget, no newline yet
    assert rules.push(at(" 1\n\ndef", 270)) == (" 1\n", "limit")
    assert rules.text == "def f():\n    return 1\n"


def test_response_fields_projection_is_flat_by_path():
    body = {"content": "x", "timings": {"prompt_n": 3, "predicted_n": 2}, "tokens_cached": 1}
    assert _project(body, ["content", "timings/prompt_n", "nope", "timings/x"]) == \
        {"content": "x", "timings/prompt_n": 3}
    assert _project(body, None) is body


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


def test_cors_origin_rules():
    local = CorsMiddleware(None)
    assert local.allow("http://localhost:5173") == "http://localhost:5173"
    assert local.allow("http://[::1]:80") == "http://[::1]:80" and local.allow("http://app.localhost")
    assert local.allow("https://example.com") is None and local.allow("") is None
    assert CorsMiddleware(None, "*").allow("https://example.com") == "*"
    listed = CorsMiddleware(None, "https://a.example, https://b.example")
    assert listed.allow("https://b.example") and listed.allow("https://c.example") is None


def test_metrics_text_has_the_promised_series():
    from localspec.server.metrics import Metrics

    text = Metrics().render(speculation_enabled=True, queue_waiting=0, busy=False)
    for name in ("localspec_requests_total", "llamacpp:tokens_predicted_total", "localspec_draft_n_total",
                 "localspec_draft_n_accepted_total", "localspec_acceptance_rate",
                 "localspec_tokens_per_second_bucket", "localspec_speculation_enabled 1"):
        assert name in text


def test_long_prefix_drops_whole_line_blocks_so_an_edit_keeps_the_start():
    fim = FimTokens(PRE, SUF, MID)
    lines = [f"line {i:03d} = value\n" for i in range(200)]
    a = build_infill(fim, tok, prefix="".join(lines), suffix="", n_ctx=4096, n_batch=2048)
    lines[190] = "line 190 = a much longer value than before\n"
    b = build_infill(fim, tok, prefix="".join(lines), suffix="", n_ctx=4096, n_batch=2048)
    assert a.truncated and b.truncated
    assert a.tokens[1:400] == b.tokens[1:400]  # same start: the cache keeps everything up to the edit
    assert "".join(map(chr, a.tokens[1:20])).startswith("line ")  # cut at a line boundary
