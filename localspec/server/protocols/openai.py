"""OpenAI-compatible routes: `/v1/completions` (a `suffix` makes it fill-in-the-middle), `/v1/chat/completions`
(the GGUF's chat template), `/v1/models`. Streaming is SSE ending in `data: [DONE]`.

Any `model` name is served by the loaded model, as llama-server and LM Studio do (clients hard-code names);
every response reports the served name (`--alias`, else the model's). Besides `usage`, responses carry
llama-server's `timings` and our `speculative` block (clients ignore extra fields; the `openai` package exposes
them through `model_extra`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...backend import llama_build
from ...engine.answer import AnswerStream, Reading, read_answer
from ...engine.engine import Chunk
from ...engine.tools import ToolCall
from ...sampling.logprobs import TokenLogprob
from ..execution.run import SSE_KEEPALIVE, Choice, Choices, Run, plan, sse_data
from ..execution.timings import progress_fields, speculative
from ..execution.worker import Build, Job, Progress, Prompt
from ..http import ApiError
from ..request.chat import chat_prompt, openai_plan
from ..request.chat_tools import is_legacy, openai_delta, openai_finish, openai_message
from ..request.fim import infill_build, require_fim
from ..request.prompts import One, checked_prompts, plain_build
from ..request.samplers import chained, parse_samplers
from ..request.sampling_fields import sampling, stops
from ..request.schemas import OAIChatRequest, OAICompletionRequest
from ..request.structured import request_extras
from ..state import State, StateDep
from .probs import openai_chat, openai_completion

DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # OpenAI's
FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop", None: None}

OAIRequest = OAICompletionRequest | OAIChatRequest


def router(state: State) -> APIRouter:
    """The routes; handlers reach `state` through `StateDep` (the same object app.py passes here)."""
    r = APIRouter(tags=["OpenAI"])
    r.add_api_route("/v1/models", models, methods=["GET"])
    r.add_api_route("/models", models, methods=["GET"], include_in_schema=False)
    r.add_api_route("/v1/completions", completions, methods=["POST"])
    r.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    r.add_api_route("/chat/completions", chat, methods=["POST"], include_in_schema=False)
    return r


async def models(state: StateDep) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": state.model_name, "object": "model",
                                        "created": int(state.started_at), "owned_by": "localspec",
                                        "aliases": state.aliases, "tags": list(state.config.tags),
                                        "meta": {"n_ctx": state.n_ctx, "drafter": state.engine.drafter_name}}]}


async def completions(req: OAICompletionRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/v1/completions")
    prompts = checked_prompts(req.prompt, state.engine.target.n_vocab)
    if req.suffix:
        fim = require_fim(state.engine.metadata, state.engine.name)
        builds = [infill_build(fim, prefix=_text(p), suffix=req.suffix) for p in prompts]
    else:
        builds = [plain_build(p) for p in prompts]
    return await OpenAIAnswer(state, req, request, builds, chat=False).answer()


async def chat(req: OAIChatRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/v1/chat/completions")
    if req.max_completion_tokens is not None and req.max_tokens is None:
        req.max_tokens = req.max_completion_tokens
    chat_plan = openai_plan(state.engine, req, state.config.reasoning_format)  # bad tools: a 400 before the run
    text = chat_prompt(state.engine, chat_plan)
    prompt: Prompt = text  # the worker tokenizes it, unless the system tokens need the tokens here
    keep = 0
    if state.config.context_shift:
        prompt = state.engine.tokenize(text)
        keep = state.engine.system_tokens(chat_plan, prompt)
    return await OpenAIAnswer(state, req, request, [lambda e: (prompt, False)], chat=True, n_keep=keep,
                              reading=chat_plan.reading(text)).answer()


def _text(prompt: One) -> str:
    if not isinstance(prompt, str):
        raise ApiError(400, "with a `suffix` (fill-in-the-middle) each prompt must be text")
    return prompt


def _logprobs(req: OAIRequest) -> int | None:
    """Top-n count per token, or None when not asked: chat sends `logprobs: true` + `top_logprobs: n`,
    completions the legacy `logprobs: n`."""
    if isinstance(req, OAIChatRequest):
        if not req.logprobs:
            if req.top_logprobs:
                raise ApiError(400, "top_logprobs requires logprobs: true")
            return None
        return req.top_logprobs or 0
    return req.logprobs


class OpenAIAnswer:
    """One completions or chat request: `n` choices per prompt, generated one after another on the one worker
    (each later one reuses the prompt's KV cache); `choices[].index` is prompt * n + choice, as OpenAI and
    llama-server number them. A chat answer is read as reasoning, content and tool calls (`reading`)."""

    def __init__(self, state: State, req: OAIRequest, request: Request, builds: list[Build], *, chat: bool,
                 n_keep: int = 0, reading: Reading = Reading()) -> None:
        self.state, self.req, self.chat, self.n_keep, self.reading = state, req, chat, n_keep, reading
        self.legacy = isinstance(req, OAIChatRequest) and is_legacy(req)
        self.choices = Choices(state, request, plan(builds, req.n, req.seed), self.job)
        self.ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())

    def job(self, choice: Choice) -> Job:
        """One choice's job: a fresh constraint (grammar state) and the choice's seed."""
        state, req = self.state, self.req
        extra = request_extras(state.engine, logit_bias=req.logit_bias, grammar=req.grammar,
                               json_schema=req.json_schema, response_format=req.response_format,
                               logprobs=_logprobs(req),
                               tool_grammar=self.reading.plan.grammar if self.reading.plan else None)
        params = chained(parse_samplers(req.samplers), state, sampling(req.temperature, req.top_k, req.top_p,
                                                                       req.min_p, choice.seed, defaults=DEFAULTS,
                                                                       penalties=req, **extra))
        return Job(choice.build, params=params, max_tokens=state.budget(req.max_tokens, "max_tokens"),
                   stop=stops(req.stop), context_shift=state.config.context_shift, n_keep=self.n_keep,
                   live=bool(req.stream))

    async def answer(self) -> Response:
        await self.choices.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
        if self.req.stream:
            return StreamingResponse(self.stream(), media_type="text/event-stream")
        out = []
        async for choice, run in self.choices.each():
            text = ""
            lps: list[TokenLogprob] = []
            async for ch in run.chunks():
                text += ch.text
                lps.extend(ch.step.logprobs)
            if run.cancelled:
                return Response(status_code=499)  # the client hung up: nobody reads this
            out.append(self.choice(choice.index, text, self.logprobs(run.job, lps),
                                   FINISH[run.last.finish if run.last else None], whole=True))
            if self.chat:
                answer = read_answer(text, self.reading)
                out[-1].update(message=openai_message(answer, legacy=self.legacy),
                               finish_reason=openai_finish(out[-1]["finish_reason"], answer.calls, legacy=self.legacy))
        return JSONResponse({"id": self.ident, "object": self.object, "created": self.created,
                             "model": self.state.model_name, "system_fingerprint": llama_build(), "choices": out,
                             **self.extras()})

    def choice(self, index: int, text: str | None, lps: Any, finish: str | None, *, whole: bool = False,
               role: bool = False, delta: dict[str, Any] | None = None) -> dict[str, Any]:
        """One entry of `choices`: a chat `message` (whole) or `delta` (streamed; `delta` its fields when given),
        or a completion's `text`."""
        c: dict[str, Any] = {"index": index, "logprobs": lps, "finish_reason": finish}
        if not self.chat:
            c["text"] = text or ""
        elif whole:
            c["message"] = {"role": "assistant", "content": text}
        else:
            c["delta"] = ({"role": "assistant", "content": None} if role else delta if delta is not None
                          else {} if text is None else {"content": text})
        return c

    def logprobs(self, job: Job, lps: list, offset: int = 0) -> dict[str, Any] | None:
        if job.params.logprobs is None:
            return None
        return openai_chat(self.state.engine, lps) if self.chat else openai_completion(self.state.engine, lps, offset)

    def usage(self) -> dict[str, Any]:
        """Prompt tokens once per prompt (its first choice's), completion tokens over every choice."""
        runs, n = self.choices.runs, self.req.n
        heads = [r for c, r in runs if c.index % n == 0]
        n_prompt = sum(r.started.n_prompt_tokens for r in heads if r.started)
        n_gen = sum(r.stats.n_generated for _, r in runs)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen,
                "prompt_tokens_details": {"cached_tokens": sum(r.stats.n_cached for r in heads)}}

    def extras(self) -> dict[str, Any]:
        """usage over every choice; `timings` and `speculative` are the first choice's."""
        run = self.choices.runs[0][1]
        return {"usage": self.usage(), "timings": run.timings, "speculative": speculative(self.state, run)}

    def chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        """A streamed chunk around one choice (none: the usage chunk)."""
        return {"id": self.ident, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.state.model_name, "system_fingerprint": llama_build(),
                "choices": [choice] if choice is not None else []}

    async def stream(self) -> AsyncIterator[str]:
        req = self.req
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        async for event in self.choices.streamed(self.sse):
            yield event
        if not self.choices.complete:
            return  # a later choice could not start: the stream ended with its error event
        if include_usage:  # OpenAI: a last chunk with no choices, carrying usage (llama-server's: and timings)
            yield sse_data(self.chunk(None) | self.extras())
        yield "data: [DONE]\n\n"

    async def sse(self, choice: Choice, run: Run) -> AsyncIterator[str]:
        """One choice's chunks: the role first (chat), a chunk per round with text or logprobs, its finish."""
        req = self.req
        head = self.chunk(self.choice(choice.index, "", None, None, role=True))
        if self.chat and not req.return_progress:  # OpenAI's first chat delta: the role, content null
            yield sse_data(head)
        offset = 0
        answer = AnswerStream(self.reading) if self.chat else None
        async for ch in run.events(bool(req.return_progress)):
            if not isinstance(ch, Chunk):  # the prompt is still being read
                yield self.waiting(head, ch)
                continue
            if ch.text or ch.step.logprobs:
                lps = self.logprobs(run.job, list(ch.step.logprobs), offset)
                delta = openai_delta(answer.push(ch.text), legacy=self.legacy) if answer else None
                offset += len(ch.text)
                if delta == {} and lps is None:
                    continue  # text held back: it may still become a tag or a call
                d = self.chunk(self.choice(choice.index, ch.text, lps, None, delta=delta))
                if req.timings_per_token:
                    d["timings"] = run.timings
                yield sse_data(d)
        rest = openai_delta(answer.finish(), legacy=self.legacy) if answer else None
        if rest:
            yield sse_data(self.chunk(self.choice(choice.index, None, None, None, delta=rest)))
        yield sse_data(self.finish(choice, run, answer.calls if answer else []))

    def waiting(self, head: dict[str, Any], p: Progress | None) -> str:
        """What the stream sends while the prompt is read: llama-server's progress events when asked (each
        repeats the head, as there), else an SSE comment that keeps the connection alive."""
        if p is None or not self.req.return_progress:
            return SSE_KEEPALIVE
        return sse_data(head | progress_fields(p, self.req.timings_per_token))

    def finish(self, choice: Choice, run: Run, calls: list[ToolCall]) -> dict[str, Any]:
        """A choice's last chunk (`finish_reason` "tool_calls" when it made calls); the request's last also carries
        the first choice's timings and speculative."""
        reason = openai_finish(FINISH[run.last.finish if run.last else "stop"], calls, legacy=self.legacy)
        final = self.chunk(self.choice(choice.index, None, None, reason))
        if len(self.choices.runs) == len(self.choices.plan):
            first = self.choices.runs[0][1]
            final.update(timings=first.timings, speculative=speculative(self.state, first))
            if not (self.req.stream_options and self.req.stream_options.include_usage):
                final["usage"] = self.usage()  # not OpenAI's, but clients before stream_options read it
        elif self.req.timings_per_token:
            final["timings"] = run.timings
        return final
