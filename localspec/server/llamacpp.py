"""llama-server's routes: `/infill` (what llama.vim and llama.vscode call), `/completion`, `/health`, `/props`.

Responses use llama-server's field names (`content`, `stop`, `tokens_cached`, `timings{...}`) so editor plugins
read them unchanged; `timings` also carries `draft_n`/`draft_n_accepted`, and `speculative` says whether
speculation ran for this request. Streaming is SSE: `data: {...}` lines, the last one with `stop: true`.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from ..fim import Extra, FimTokens, build_infill, indent_cut, require_fim
from ..session import Engine
from .common import ApiError, ClientGone, Run, State, sampling, speculative, stops, timings
from .schemas import CompletionRequest, InfillRequest
from .worker import Job

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}  # llama-server's


def router(state: State) -> APIRouter:
    r = APIRouter(tags=["llama.cpp"])

    @r.get("/health")
    async def health() -> Response:
        if not state.worker.alive():
            return JSONResponse({"error": {"code": 503, "message": "generation worker is not running",
                                           "type": "unavailable_error"}}, status_code=503)
        return JSONResponse({"status": "ok"})

    @r.get("/props")
    async def props() -> dict[str, Any]:
        e = state.engine
        return {"model": e.name, "model_path": str(e.target.path), "n_ctx": state.n_ctx,
                "drafter": e.drafter_name, "k": e.controller.state().k_now if e.drafter else 0, "total_slots": 1,
                "default_generation_settings": {"n_ctx": state.n_ctx, "params": dict(DEFAULTS)},
                "chat_template": e.chat_template or "", "fim": require_fim_ok(e),
                "spec_max_queue": state.config.spec_max_queue, "build_info": f"localspec {__version__}",
                "devices": devices_in_use(e)}

    @r.post("/completion")
    @r.post("/completions", include_in_schema=False)
    async def completion(req: CompletionRequest, request: Request) -> Response:
        # like llama-server, the llama.cpp routes ignore `model`: there is one
        state.metrics.request("/completion")
        prompt = req.prompt
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < state.engine.target.n_vocab]
            if bad:
                raise ApiError(400, f"prompt token ids must be in [0, {state.engine.target.n_vocab}), got {bad[0]}")
        return await _answer(state, req, request, lambda e: (prompt, False))

    @r.post("/infill")
    async def infill(req: InfillRequest, request: Request) -> Response:
        state.metrics.request("/infill")
        fim = require_fim(state.engine.metadata, state.engine.name)
        n_predict = req.n_predict if req.n_predict > 0 else 0

        def build(e: Engine) -> tuple[list[int], bool]:
            t = e.target
            p = build_infill(fim, lambda s: t.tokenize(s, add_special=False, parse_special=False),
                             prefix=req.input_prefix, suffix=req.input_suffix, prompt=_text(req.prompt),
                             extra=[Extra(c.text, c.filename) for c in req.input_extra],
                             bos=t.bos if t.add_bos and t.bos >= 0 else None, n_ctx=t.n_ctx, n_predict=n_predict)
            return p.tokens, p.truncated

        return await _answer(state, req, request, build)

    return r


def devices_in_use(e: Engine) -> list[dict[str, Any]]:
    """ggml's devices with their free/total memory (an RPC device's as its server reports it); `target` marks
    the ones the target's offloaded layers use (`--rpc` servers first, then local GPUs)."""
    from ..backend import devices

    used = set(e.target.offload_devices)
    return [{**d, "target": d["name"] in used} for d in devices()]


def require_fim_ok(e: Engine) -> bool:
    return FimTokens.from_metadata(e.metadata) is not None


def _text(prompt: str | list[int]) -> str:
    if isinstance(prompt, list):
        raise ApiError(400, "/infill takes `prompt` as text (the part of the current line before the cursor)")
    return prompt


async def _answer(state: State, req: CompletionRequest, request: Request, build) -> Response:
    job = Job(build, params=sampling(req.temperature, req.top_k, req.top_p, req.min_p, req.seed, defaults=DEFAULTS),
              max_tokens=state.budget(req.n_predict), stop=stops(req.stop))
    run = Run(state, job, request)
    try:
        started = await run.start()
    except ClientGone:
        return Response(status_code=499)
    if req.stream:
        return StreamingResponse(_sse(state, run, req), media_type="text/event-stream")
    content, stop_type = "", "none"
    async for piece, stop_type in _policed(run, req):
        content += piece
    body = _final(state, run, req, content, stop_type, started.truncated)
    return JSONResponse(_project(body, req.response_fields))


async def _policed(run: Run, req: CompletionRequest) -> AsyncIterator[tuple[str, str]]:
    """(text, stop_type) per round, applying llama-server's editor rules: `n_indent` ends the completion at a
    line indented less than the cursor; `t_max_predict_ms` ends it at a newline once over budget."""
    text = ""
    async for ch in run.chunks():
        new = text + ch.text
        cut = indent_cut(new, req.n_indent)
        if cut is not None:
            yield new[len(text):cut] if cut > len(text) else "", "limit"
            return
        text = new
        over = bool(req.t_max_predict_ms) and ch.stats.gen_ms > req.t_max_predict_ms and "\n" in text
        if ch.finish or over:
            stop_type = ("eos" if ch.step.finish == "stop" else "word") if ch.finish == "stop" else "limit"
            yield ch.text, stop_type
            return
        yield ch.text, "none"


def _final(state: State, run: Run, req: CompletionRequest, content: str, stop_type: str,
           truncated: bool) -> dict[str, Any]:
    s = run.stats
    started = run.started
    return {"index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": state.engine.name,
            "tokens_predicted": s.n_generated,
            "tokens_evaluated": started.n_prompt_tokens if started else 0,
            "tokens_cached": s.n_cached, "truncated": truncated, "has_new_line": "\n" in content,
            "stop_type": stop_type, "stopping_word": "",
            "generation_settings": {"n_predict": req.n_predict, "temperature": run.job.params.temperature,
                                    "top_k": run.job.params.top_k, "top_p": run.job.params.top_p,
                                    "min_p": run.job.params.min_p, "n_ctx": state.n_ctx},
            "timings": timings(s), "speculative": speculative(state, started, s)}


async def _sse(state: State, run: Run, req: CompletionRequest) -> AsyncIterator[str]:
    stop_type = "none"
    async for piece, stop_type in _policed(run, req):
        if piece:
            yield _data({"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": 0,
                         "tokens_predicted": run.stats.n_generated})
    yield _data(_final(state, run, req, "", stop_type, bool(run.started and run.started.truncated)))


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _project(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's `response_fields`: keep the listed paths ("timings/prompt_n"), keyed by the path."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for f in fields:
        cur: Any = body
        for part in f.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                break
            cur = cur[part]
        else:
            out[f] = cur
    return out
