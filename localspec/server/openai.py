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
from ..engine.engine import Engine
from ..errors import LocalspecError
from ..sampling.logprobs import TokenLogprob
from .chat import chat_messages_prompt, system_tokens
from .common import (
    ApiError,
    Build,
    Choice,
    ClientGone,
    Run,
    State,
    error_event,
    plan,
    progress,
    sampling,
    speculative,
    stops,
)
from .fim import FimTokens, build_infill, require_fim
from .probs import openai_chat, openai_completion
from .prompts import One, check_ids, prompt_input, split_prompts
from .samplers import chained, parse_samplers
from .schemas import OAIChatRequest, OAICompletionRequest
from .structured import request_extras
from .worker import Job, Prompt

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
                                            "aliases": state.aliases, "tags": list(state.config.tags),
                                            "meta": {"n_ctx": state.n_ctx, "drafter": state.engine.drafter_name}}]}

    @r.post("/v1/completions")
    async def completions(req: OAICompletionRequest, request: Request) -> Response:
        state.metrics.request("/v1/completions")
        prompts = split_prompts(req.prompt)
        for p in prompts:
            if isinstance(p, list):
                check_ids(p, state.engine.target.n_vocab)
        if req.suffix:
            fim = require_fim(state.engine.metadata, state.engine.name)
            builds = [_fim(fim, _text(p), req.suffix) for p in prompts]
        else:
            builds = [_plain(p) for p in prompts]
        return await _answer(state, req, request, builds, chat=False)

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions", include_in_schema=False)
    async def chat(req: OAIChatRequest, request: Request) -> Response:
        state.metrics.request("/v1/chat/completions")
        if req.max_completion_tokens is not None and req.max_tokens is None:
            req.max_tokens = req.max_completion_tokens
        text = chat_messages_prompt(state.engine, req)  # a bad message list is a 400 before anything runs
        keep = system_tokens(state.engine, req, text) if state.config.context_shift else 0
        return await _answer(state, req, request, [lambda e: (text, False)], chat=True, n_keep=keep)

    return r


def _fim(fim: FimTokens, prefix: str, suffix: str) -> Build:
    def build(e: Engine) -> tuple[Prompt, bool]:
        t = e.target
        p = build_infill(fim, lambda s: t.tokenize(s, add_special=False, parse_special=False), prefix=prefix,
                         suffix=suffix, bos=t.bos if t.add_bos and t.bos >= 0 else None, n_ctx=t.n_ctx)
        return p.tokens, p.truncated
    return build


def _plain(prompt: One) -> Build:
    def build(e: Engine) -> tuple[Prompt, bool]:
        return prompt_input(e, prompt), False
    return build


def _text(prompt: One) -> str:
    if not isinstance(prompt, str):
        raise ApiError(400, "with a `suffix` (fill-in-the-middle) each prompt must be text")
    return prompt


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


def _job(state: State, req: OAICompletionRequest | OAIChatRequest, choice: Choice, chat: bool, n_keep: int = 0) -> Job:
    """One choice's job: a fresh constraint (grammar state) and the choice's seed."""
    extra = request_extras(state.engine, logit_bias=req.logit_bias, grammar=req.grammar,
                           json_schema=req.json_schema, response_format=req.response_format,
                           logprobs=_logprobs(req, chat))
    params = chained(parse_samplers(req.samplers), state, sampling(req.temperature, req.top_k, req.top_p,
                                                                   req.min_p, choice.seed, defaults=DEFAULTS,
                                                                   penalties=req, **extra))
    return Job(choice.build, params=params, max_tokens=state.budget(req.max_tokens, "max_tokens"),
               stop=stops(req.stop), context_shift=state.config.context_shift, n_keep=n_keep, live=bool(req.stream))


async def _answer(state: State, req: OAICompletionRequest | OAIChatRequest, request: Request, builds: list[Build],
                  *, chat: bool, n_keep: int = 0) -> Response:
    """`n` choices per prompt, generated one after another on the one worker (each later one reuses the
    prompt's KV cache); `choices[].index` is prompt * n + choice, as OpenAI and llama-server number them."""
    choices = plan(builds, req.n, req.seed)
    first = Run(state, _job(state, req, choices[0], chat, n_keep), request)
    await first.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(state, req, request, choices, first, ident, chat, usage, n_keep),
                                 media_type="text/event-stream")
    out, runs = [], []
    for i, choice in enumerate(choices):
        run = first
        if i:
            run = Run(state, _job(state, req, choice, chat, n_keep), request)
            await run.start()
        text = ""
        lps: list[TokenLogprob] = []
        async for ch in run.chunks():
            text += ch.text
            lps.extend(ch.step.logprobs)
        if run.last is not None and run.last.finish == "cancelled":
            return Response(status_code=499)  # the client hung up: nobody reads this
        c: dict[str, Any] = {"index": choice.index, "logprobs": _choice_logprobs(state, run.job, lps, chat),
                             "finish_reason": FINISH[run.last.finish if run.last else None]}
        if chat:
            c["message"] = {"role": "assistant", "content": text}
        else:
            c["text"] = text
        out.append(c)
        runs.append((choice, run))
    return JSONResponse({"id": ident, "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": state.model_name, "system_fingerprint": FINGERPRINT,
                         "choices": out, **_extras(state, runs, req.n)})


def _choice_logprobs(state: State, job: Job, lps: list, chat: bool, offset: int = 0) -> dict[str, Any] | None:
    if job.params.logprobs is None:
        return None
    return openai_chat(state.engine, lps) if chat else openai_completion(state.engine, lps, offset)


def _usage(runs: list[tuple[Choice, Run]], n: int) -> dict[str, Any]:
    """Prompt tokens once per prompt (its first choice's), completion tokens over every choice."""
    heads = [r for c, r in runs if c.index % n == 0]
    n_prompt = sum(r.started.n_prompt_tokens for r in heads if r.started)
    n_gen = sum(r.stats.n_generated for _, r in runs)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": sum(r.stats.n_cached for r in heads)}}


def _extras(state: State, runs: list[tuple[Choice, Run]], n: int) -> dict[str, Any]:
    """usage over every choice; `timings` and `speculative` are the first choice's."""
    run = runs[0][1]
    return {"usage": _usage(runs, n), "timings": run.timings, "speculative": speculative(state, run)}


async def _sse(state: State, req: OAICompletionRequest | OAIChatRequest, request: Request, choices: list[Choice],
               first: Run, ident: str, chat: bool, include_usage: bool, n_keep: int = 0) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if chat else "text_completion"
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any] | None, text: str | None, finish: str | None,
              lps: Any = None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": index, "logprobs": lps, "finish_reason": finish}
        if chat:
            c["delta"] = delta or {}
        else:
            c["text"] = text or ""
        return {"id": ident, "object": obj, "created": created, "model": state.model_name,
                "system_fingerprint": FINGERPRINT, "choices": [c]}

    runs: list[tuple[Choice, Run]] = []
    for i, choice in enumerate(choices):
        run = first
        if i:
            run = Run(state, _job(state, req, choice, chat, n_keep), request)
            try:
                await run.start()
            except ClientGone:
                return
            except LocalspecError as e:
                yield _data(error_event(e))
                return
        runs.append((choice, run))
        head = chunk(choice.index, {"role": "assistant", "content": None}, "", None)
        if req.return_progress and run.job.first is not None:
            head["prompt_progress"] = progress(run.job.first)
        if chat or req.return_progress:  # OpenAI's first chat delta: the role, content null (llama-server's)
            yield _data(head)
        offset = 0
        async for ch in run.chunks():
            if ch.text or ch.step.logprobs:
                d = chunk(choice.index, {"content": ch.text}, ch.text, None,
                          lps=_choice_logprobs(state, run.job, list(ch.step.logprobs), chat, offset))
                if req.timings_per_token:
                    d["timings"] = run.timings
                yield _data(d)
                offset += len(ch.text)
        final = chunk(choice.index, None, None, FINISH[run.last.finish if run.last else "stop"])
        if i == len(choices) - 1:
            final.update(timings=runs[0][1].timings, speculative=speculative(state, runs[0][1]))
            if not include_usage:
                final["usage"] = _usage(runs, req.n)  # not OpenAI's, but clients before stream_options read it
        elif req.timings_per_token:
            final["timings"] = run.timings
        yield _data(final)
    if include_usage:  # OpenAI: a last chunk with no choices, carrying usage
        yield _data({"id": ident, "object": obj, "created": created, "model": state.model_name,
                     "system_fingerprint": FINGERPRINT, "choices": [], "usage": _usage(runs, req.n)})
    yield "data: [DONE]\n\n"


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"
