"""OpenAI-compatible routes: `/v1/completions` (a `suffix` makes it fill-in-the-middle), `/v1/chat/completions`
(the GGUF's chat template), `/v1/models`. Streaming is SSE ending in `data: [DONE]`.

Any `model` name is served by the loaded model, as llama-server and LM Studio do (clients hard-code names);
every response reports the served name (`--alias`, else the model's). Besides `usage`, responses carry
llama-server's `timings` and our `speculative` block (clients ignore extra fields; the `openai` package exposes
them through `model_extra`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from ..engine.session import Engine
from .common import ApiError, Run, State, chat_prompt, chat_text, sampling, speculative, stops, timings
from .fim import build_infill, require_fim
from .probs import openai_chat, openai_completion
from .schemas import OAIChatRequest, OAICompletionRequest
from .structured import request_extras
from .worker import Job

FINGERPRINT = f"localspec-{__version__}"  # system_fingerprint: changes when the serving code does

DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # OpenAI's
FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop", None: None}


def router(state: State) -> APIRouter:
    r = APIRouter(tags=["OpenAI"])

    @r.get("/v1/models")
    @r.get("/models", include_in_schema=False)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model",
                                            "created": int(state.started_at), "owned_by": "localspec",
                                            "meta": {"n_ctx": state.n_ctx, "drafter": state.engine.drafter_name}}]}

    @r.post("/v1/completions")
    async def completions(req: OAICompletionRequest, request: Request) -> Response:
        state.metrics.request("/v1/completions")
        prompt = _one_prompt(req.prompt)
        if req.suffix:
            fim = require_fim(state.engine.metadata, state.engine.name)

            def build(e: Engine) -> tuple[list[int], bool]:
                t = e.target
                p = build_infill(fim, lambda s: t.tokenize(s, add_special=False, parse_special=False),
                                 prefix=prompt, suffix=req.suffix or "",
                                 bos=t.bos if t.add_bos and t.bos >= 0 else None, n_ctx=t.n_ctx)
                return p.tokens, p.truncated
        else:
            def build(e: Engine) -> tuple[str, bool]:
                return prompt, False
        return await _answer(state, req, request, build, chat=False)

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions", include_in_schema=False)
    async def chat(req: OAIChatRequest, request: Request) -> Response:
        state.metrics.request("/v1/chat/completions")
        msgs = [{"role": "system" if m.role == "developer" else m.role, "content": chat_text(m.content)}
                for m in req.messages]
        if req.max_completion_tokens is not None and req.max_tokens is None:
            req.max_tokens = req.max_completion_tokens
        return await _answer(state, req, request, lambda e: chat_prompt(e, msgs), chat=True)

    return r


def _one_prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        raise ApiError(400, f"this server completes one prompt per request, got {len(prompt)}")
    return prompt[0]


def _logprobs(req: OAICompletionRequest | OAIChatRequest, chat: bool) -> int | None:
    """Top-n count per token, or None when not asked: chat sends `logprobs: true` + `top_logprobs: n`,
    completions the legacy `logprobs: n`."""
    if isinstance(req, OAIChatRequest):
        if not req.logprobs:
            if req.top_logprobs:
                raise ApiError(400, "top_logprobs requires logprobs: true")
            return None
        return req.top_logprobs or 0
    return req.logprobs


async def _answer(state: State, req: OAICompletionRequest | OAIChatRequest, request: Request, build,
                  *, chat: bool) -> Response:
    if req.n != 1:
        raise ApiError(400, f"n = {req.n}: this server returns one choice per request; send n: 1 (or several "
                            "requests; with a seed each is reproducible)")
    extra = request_extras(state.engine, logit_bias=req.logit_bias, grammar=req.grammar,
                           json_schema=req.json_schema, response_format=req.response_format,
                           logprobs=_logprobs(req, chat))
    job = Job(build, params=sampling(req.temperature, req.top_k, req.top_p, req.min_p, req.seed, defaults=DEFAULTS,
                                     penalties=req, **extra),
              max_tokens=state.budget(req.max_tokens, "max_tokens"), stop=stops(req.stop))
    run = Run(state, job, request)
    await run.start()  # a client gone before the start is a 499 (app.py)
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(state, run, ident, chat, usage), media_type="text/event-stream")
    text, lps = "", []
    async for ch in run.chunks():
        text += ch.text
        lps.extend(ch.step.logprobs)
    if run.last is not None and run.last.finish == "cancelled":
        return Response(status_code=499)  # the client hung up: nobody reads this
    choice: dict[str, Any] = {"index": 0, "logprobs": _choice_logprobs(state, job, lps, chat),
                              "finish_reason": FINISH[run.last.finish if run.last else None]}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return JSONResponse({"id": ident, "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": state.model_name, "system_fingerprint": FINGERPRINT,
                         "choices": [choice], **_extras(state, run)})


def _choice_logprobs(state: State, job: Job, lps: list, chat: bool, offset: int = 0) -> dict[str, Any] | None:
    if job.params.logprobs is None:
        return None
    return openai_chat(state.engine, lps) if chat else openai_completion(state.engine, lps, offset)


def _usage(run: Run) -> dict[str, Any]:
    s = run.stats
    n_prompt = run.started.n_prompt_tokens if run.started else 0
    return {"prompt_tokens": n_prompt, "completion_tokens": s.n_generated, "total_tokens": n_prompt + s.n_generated,
            "prompt_tokens_details": {"cached_tokens": s.n_cached}}


def _extras(state: State, run: Run) -> dict[str, Any]:
    s = run.stats
    return {"usage": _usage(run), "timings": timings(s), "speculative": speculative(state, run)}


async def _sse(state: State, run: Run, ident: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if chat else "text_completion"
    created = int(time.time())
    offset = 0

    def chunk(piece: str | None, finish: str | None, first: bool = False, lps: Any = None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "logprobs": lps, "finish_reason": finish}
        if chat:
            c["delta"] = ({"role": "assistant", "content": piece or ""} if first
                          else {"content": piece} if piece is not None else {})
        else:
            c["text"] = piece or ""
        return {"id": ident, "object": obj, "created": created, "model": state.model_name,
                "system_fingerprint": FINGERPRINT, "choices": [c]}

    if chat:
        yield _data(chunk("", None, first=True))
    async for ch in run.chunks():
        if ch.text or ch.step.logprobs:
            yield _data(chunk(ch.text, None, lps=_choice_logprobs(state, run.job, list(ch.step.logprobs), chat,
                                                                  offset)))
            offset += len(ch.text)
    final = chunk(None, FINISH[run.last.finish if run.last else "stop"])
    final.update(timings=timings(run.stats), speculative=speculative(state, run))
    if not include_usage:
        final["usage"] = _usage(run)  # not OpenAI's, but clients before stream_options read it here
    yield _data(final)
    if include_usage:  # OpenAI: a last chunk with no choices, carrying usage
        yield _data({"id": ident, "object": obj, "created": created, "model": state.model_name,
                     "system_fingerprint": FINGERPRINT, "choices": [], "usage": _usage(run)})
    yield "data: [DONE]\n\n"


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"
