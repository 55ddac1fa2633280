"""llama-server's routes: `/infill` (what llama.vim and llama.vscode call), `/completion`, `/health`, `/props`,
`/tokenize`, `/detokenize`, `/apply-template`.

Responses use llama-server's field names (`content`, `stop`, `tokens_cached`, `timings{...}`) so editor plugins
read them unchanged; `timings` also carries `draft_n`/`draft_n_accepted`, and `speculative` says whether
speculation ran for this request. Streaming is SSE: `data: {...}` lines, the last one with `stop: true`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from ..engine.session import Chunk, Engine
from .common import ApiError, Run, State, chat_prompt, chat_text, sampling, spec_policy, speculative, stops, timings
from .fim import Extra, FimTokens, build_infill, indent_cut, require_fim
from .probs import llama_probs
from .schemas import CompletionRequest, DetokenizeRequest, InfillRequest, OAIChatRequest, TokenizeRequest
from .structured import request_extras
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
        return {"model": state.model_name, "model_path": str(e.target.path), "n_ctx": state.n_ctx,
                "drafter": e.drafter_name, "k": spec_policy(e)[0], "total_slots": 1,
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

    @r.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        # the vocabulary is read-only: llama-server too tokenizes outside its generation loop
        t = state.engine.target
        toks = t.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
        if not req.with_pieces:
            return {"tokens": toks}
        return {"tokens": [{"id": i, "piece": _piece(t.piece(i))} for i in toks]}

    @r.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, str]:
        t = state.engine.target
        bad = [i for i in req.tokens if not 0 <= i < t.n_vocab]
        if bad:
            raise ApiError(400, f"token ids must be in [0, {t.n_vocab}), got {bad[0]}")
        return {"content": t.detokenize(req.tokens)}

    @r.post("/apply-template")
    async def apply_template(req: OAIChatRequest) -> dict[str, str]:
        msgs = [{"role": "system" if m.role == "developer" else m.role, "content": chat_text(m.content)}
                for m in req.messages]
        return {"prompt": chat_prompt(state.engine, msgs)[0]}

    return r


def devices_in_use(e: Engine) -> list[dict[str, Any]]:
    """ggml's devices with their free/total memory (an RPC device's as its server reports it); `target` marks
    the ones the target's offloaded layers use (`--rpc` servers first, then local GPUs)."""
    from ..backend import devices

    used = set(e.target.offload_devices)
    return [{**d, "target": d["name"] in used} for d in devices()]


def _piece(b: bytes) -> str | list[int]:
    """llama-server's `with_pieces`: the text when it is valid UTF-8, else the byte values."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def require_fim_ok(e: Engine) -> bool:
    return FimTokens.from_metadata(e.metadata) is not None


def _text(prompt: str | list[int]) -> str:
    if isinstance(prompt, list):
        raise ApiError(400, "/infill takes `prompt` as text (the part of the current line before the cursor)")
    return prompt


async def _answer(state: State, req: CompletionRequest, request: Request, build) -> Response:
    extra = request_extras(state.engine, logit_bias=req.logit_bias, grammar=req.grammar,
                           json_schema=req.json_schema, response_format=req.response_format,
                           logprobs=req.n_probs or None)
    job = Job(build, params=sampling(req.temperature, req.top_k, req.top_p, req.min_p, req.seed, defaults=DEFAULTS,
                                     penalties=req, **extra),
              max_tokens=state.budget(req.n_predict), stop=stops(req.stop))
    run = Run(state, job, request)
    started = await run.start()  # a client gone before the start is a 499 (app.py)
    if req.stream:
        return StreamingResponse(_sse(state, run, req), media_type="text/event-stream")
    content, stop_type, tokens, probs = "", "none", [], []
    async for piece, stop_type, ch in _policed(run, req):
        content += piece
        tokens.extend(ch.step.tokens)
        probs.extend(ch.step.logprobs)
    if run.job.cancelled.is_set() and run.last is not None and run.last.finish == "cancelled":
        return Response(status_code=499)  # the client hung up: nobody reads this
    body = _final(state, run, req, content, stop_type, started.truncated, tokens)
    if req.n_probs:
        body["completion_probabilities"] = llama_probs(state.engine, probs)
    return JSONResponse(_project(body, req.response_fields))


async def _policed(run: Run, req: CompletionRequest) -> AsyncIterator[tuple[str, str, Chunk]]:
    """(text, stop_type, chunk) per round, applying llama-server's editor rules: `n_indent` ends the completion
    at a line indented less than the cursor; `t_max_predict_ms` ends it at a newline once over budget."""
    text = ""
    async for ch in run.chunks():
        new = text + ch.text
        cut = indent_cut(new, req.n_indent)
        if cut is not None:
            yield new[len(text):cut] if cut > len(text) else "", "limit", ch
            return
        text = new
        over = bool(req.t_max_predict_ms) and ch.stats.gen_ms > req.t_max_predict_ms and "\n" in text
        if ch.finish or over:
            stop_type = ("eos" if ch.step.finish == "stop" else "word") if ch.finish == "stop" else "limit"
            yield ch.text, stop_type, ch
            return
        yield ch.text, "none", ch


def generation_settings(state: State, run: Run, req: CompletionRequest) -> dict[str, Any]:
    """The sampling parameters this request actually ran with (llama-server's `generation_settings`)."""
    p = run.job.params
    d: dict[str, Any] = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)
                         if f.name not in ("constraint", "logprobs", "seed")}
    d.update(seed=-1 if p.seed is None else p.seed, n_predict=run.job.max_tokens, max_tokens=run.job.max_tokens,
             stop=list(run.job.stop), stream=req.stream, n_probs=req.n_probs, n_ctx=state.n_ctx,
             logit_bias=[[t, b] for t, b in _bias_pairs(req.logit_bias)], grammar=req.grammar or "",
             json_schema=req.json_schema, samplers=["top_k", "top_p", "min_p", "temperature"],
             n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms, return_tokens=req.return_tokens,
             speculative={"drafter": state.engine.drafter_name, "k": spec_policy(state.engine)[0],
                          "allowed": bool(run.started and run.started.spec)})
    return d


def _bias_pairs(v: Any) -> list[tuple[Any, Any]]:
    if isinstance(v, dict):
        return list(v.items())
    return [tuple(x) for x in v or [] if isinstance(x, list) and len(x) == 2]


def _prompt_text(e: Engine, tokens: tuple[int, ...]) -> str:
    """The prompt as the model saw it, special tokens written out (llama-server's `prompt`)."""
    t = e.target
    return b"".join(t.piece(i) or t.token_text(i).encode() for i in tokens).decode("utf-8", "replace")


def _final(state: State, run: Run, req: CompletionRequest, content: str, stop_type: str,
           truncated: bool, tokens: list[int]) -> dict[str, Any]:
    s = run.stats
    started = run.started
    return {"index": 0, "content": content, "tokens": tokens if req.return_tokens else [], "id_slot": 0,
            "stop": True, "model": state.model_name, "tokens_predicted": s.n_generated,
            "tokens_evaluated": started.n_prompt_tokens if started else 0,
            "generation_settings": generation_settings(state, run, req),
            "prompt": _prompt_text(state.engine, started.prompt_tokens) if started else "",
            "tokens_cached": s.n_cached, "truncated": truncated, "has_new_line": "\n" in content,
            "stop_type": stop_type, "stopping_word": "",
            "timings": timings(s), "speculative": speculative(state, run)}


async def _sse(state: State, run: Run, req: CompletionRequest) -> AsyncIterator[str]:
    stop_type = "none"
    async for piece, stop_type, ch in _policed(run, req):
        if piece or (req.return_tokens and ch.step.tokens):
            d = {"index": 0, "content": piece, "tokens": list(ch.step.tokens) if req.return_tokens else [],
                 "stop": False, "id_slot": 0, "tokens_predicted": run.stats.n_generated,
                 "tokens_evaluated": run.started.n_prompt_tokens if run.started else 0}
            if req.n_probs:
                d["completion_probabilities"] = llama_probs(state.engine, ch.step.logprobs)
            yield _data(d)
    yield _data(_final(state, run, req, "", stop_type, bool(run.started and run.started.truncated), []))


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
