"""Anthropic's Messages API: `POST /v1/messages` (whole or streamed) and `POST /v1/messages/count_tokens`, for
the `anthropic` client and tools built on it (Claude Code's ANTHROPIC_BASE_URL).

A request runs as an OpenAI chat request would (anthropic_convert.py turns it into one): the GGUF's chat
template, the engine's tool-call plan when `tools` are given (a required call is grammar-constrained, so even a
tiny model writes a valid one), a trailing assistant message as a prefill the answer continues. Besides
Anthropic's fields, answers carry our `speculative` block (not llama-server's `timings`, as llama-server's own
Anthropic route leaves them out). Errors have Anthropic's shape (http.anthropic_error; http.error_body picks
it by path).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ....engine.answer import Answer, Reading, read_answer
from ...execution.run import Run
from ...execution.timings import speculative
from ...execution.worker import Job
from ...request.chat import chat_plan, chat_prompt, prefill_text
from ...request.sampling_fields import sampling, stops
from ...request.structured import request_extras
from ...state import State, StateDep
from .convert import (
    CountTokensRequest,
    MessagesRequest,
    message_body,
    openai_messages,
    openai_tools,
    response_format,
    stop_reason,
    tool_choice,
    tool_use,
    usage,
)
from .stream import events

DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # Anthropic's; top_k off


@dataclass(frozen=True)
class Prepared:
    """A request ready to run: the prompt text and how to read the answer (tool plan, reasoning)."""

    prompt: str
    reading: Reading


def prepare(state: State, req: CountTokensRequest) -> Prepared:
    """The prompt and how to read its answer; a bad request is a 400 here, before anything is queued. The tools
    and messages become the chat routes' plan (request/chat.py), in OpenAI's terms."""
    choice, parallel = tool_choice(req.tool_choice)
    plan = chat_plan(state.engine, openai_messages(req), tools=openai_tools(req.tools), choice=choice,
                     parallel=parallel, reasoning=state.config.reasoning_format)
    last = plan.messages[-1] if plan.messages else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        # Anthropic's prefill: the answer continues this text, its text blocks joined by a blank line as
        # llama-server joins a continued message's parts
        plan = replace(plan.continuing(), prefill=prefill_text(req.messages[-1].content))
    text = chat_prompt(state.engine, plan)
    return Prepared(text, plan.reading(text))


def job(state: State, req: MessagesRequest, prep: Prepared) -> Job:
    """The request's job: the tool grammar (a required call) constrains target and drafter alike."""
    plan = prep.reading.plan
    extra = request_extras(state.engine, response_format=response_format(req.output_config),
                           tool_grammar=plan.grammar if plan else None)
    params = sampling(req.temperature, req.top_k, req.top_p, None, None, defaults=DEFAULTS, **extra)
    prompt = prep.prompt
    return Job(lambda e: (prompt, False), params=params, max_tokens=state.budget(req.max_tokens, "max_tokens"),
               stop=stops(req.stop_sequences), context_shift=state.config.context_shift, live=req.stream)


def content_blocks(answer: Answer) -> list[dict[str, Any]]:
    """Thinking (when the model reasoned), text (unless only calls came back), then one tool_use per call."""
    thinking = [{"type": "thinking", "thinking": answer.reasoning, "signature": ""}] if answer.reasoning else []
    text = [{"type": "text", "text": answer.content}] if answer.content or not answer.calls else []
    return thinking + text + [tool_use(c) for c in answer.calls]


async def answer(state: State, prep: Prepared, run: Run, ident: str) -> Response:
    """The whole message."""
    text, tokens = "", list[int]()
    async for ch in run.chunks():
        text += ch.text
        tokens.extend(ch.step.tokens)
    if run.cancelled:
        return Response(status_code=499)  # the client hung up: nobody reads this
    read = read_answer(text, prep.reading)
    raw = state.engine.target.detokenize(tokens)
    reason, seq = stop_reason(run.last, text, raw, run.job.stop, bool(read.calls))
    body = message_body(state, ident, content_blocks(read), reason, seq, usage(run))
    return JSONResponse({**body, "speculative": speculative(state, run)})


def router(state: State) -> APIRouter:
    """The routes; handlers reach `state` through `StateDep` (the same object app.py passes here)."""
    r = APIRouter(tags=["Anthropic"])
    r.add_api_route("/v1/messages", messages, methods=["POST"])
    r.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"])
    return r


async def messages(req: MessagesRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/v1/messages")
    prep = prepare(state, req)
    # in a thread: the job builds the request's grammar, seconds for a large one (execution/run.py, Choices._start)
    run = Run(state, await asyncio.to_thread(job, state, req, prep), request)
    await run.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
    ident = "msg_" + uuid.uuid4().hex[:24]
    if req.stream:
        return StreamingResponse(events(state, prep.reading, run, ident), media_type="text/event-stream")
    return await answer(state, prep, run, ident)


async def count_tokens(req: CountTokensRequest, state: StateDep) -> dict[str, int]:
    """The prompt's tokens, tools and system included (what `usage` reports for the same request)."""
    state.metrics.request("/v1/messages/count_tokens")
    return {"input_tokens": len(state.engine.tokenize(prepare(state, req).prompt))}
