"""llama-server's completion answer, for `/completion` and `/infill`: the job per choice, the body (`content`,
`stop_type`, `generation_settings`, `timings`, our `speculative`), whole or as SSE, and `response_fields`.

Several results (prompts x `n_cmpl`) come as llama-server's array, each with its `index`; a stream carries every
choice's chunks in turn. The editor rules (`editor.py`) decide where each choice's text ends.
"""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...engine.engine import Chunk, Engine
from ...sampling.logprobs import TokenLogprob
from ..execution.run import SSE_KEEPALIVE, Choice, Choices, Run, plan, sse_data
from ..execution.timings import progress_fields, spec_policy, speculative
from ..execution.worker import Build, Job, Progress
from ..http import ApiError
from ..request.samplers import ORDER, chained, parse_samplers
from ..request.sampling_fields import sampling, stops
from ..request.schemas import MAX_CHOICES, CompletionRequest
from ..request.structured import request_extras
from ..state import State
from .editor import EditorRules, policed
from .probs import llama_probs, window

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}  # llama-server's


class Completion:
    """One /completion or /infill request: its choices, each with its own job and its own editor rules."""

    def __init__(self, state: State, req: CompletionRequest, request: Request, builds: list[Build]) -> None:
        self.state, self.req = state, req
        self.rules: dict[int, EditorRules] = {}  # by choice index: the one judge of that choice's chunks
        self.choices = Choices(state, request, plan(builds, n_choices(req), req.seed), self.job)

    def job(self, choice: Choice) -> Job:
        """One choice's job; its constraint (grammar state) is its own, its seed the choice's."""
        state, req = self.state, self.req
        chain = parse_samplers(req.samplers)
        base = chained(chain, state, sampling(req.temperature, req.top_k, req.top_p, req.min_p, req.seed,
                                              defaults=DEFAULTS, penalties=req))
        ask = window(req.n_probs, base, req.post_sampling_probs) if req.n_probs else None
        extra = request_extras(state.engine, logit_bias=req.logit_bias, grammar=req.grammar,
                               json_schema=req.json_schema, response_format=req.response_format, logprobs=ask)
        params = chained(chain, state, sampling(req.temperature, req.top_k, req.top_p, req.min_p, choice.seed,
                                                defaults=DEFAULTS, penalties=req, **extra))
        rules = self.rules[choice.index] = EditorRules(req)
        return Job(choice.build, params=params, max_tokens=state.budget(req.n_predict), stop=stops(req.stop),
                   context_shift=state.config.context_shift, n_keep=req.n_keep, live=bool(req.stream),
                   until=rules.until)

    async def answer(self) -> Response:
        """One result per (prompt, choice): a single object for one, llama-server's array (with `index`) for
        more."""
        await self.choices.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
        if self.req.stream:
            return StreamingResponse(self.choices.streamed(self.sse), media_type="text/event-stream")
        results = []
        async for choice, run in self.choices.each():
            body = await self.collect(choice, run)
            if body is None:
                return Response(status_code=499)  # the client hung up: nobody reads this
            results.append(body)
        return JSONResponse(results[0] if len(results) == 1 else results)

    async def collect(self, choice: Choice, run: Run) -> dict[str, Any] | None:
        content, stop_type = "", "none"
        tokens: list[int] = []
        probs: list[TokenLogprob] = []
        async for piece, stop_type, ch in policed(run, self.rules[choice.index]):
            content += piece
            tokens.extend(ch.step.tokens)
            probs.extend(ch.step.logprobs)
        if run.job.cancelled.is_set() and run.cancelled:
            return None
        body = self.final(run, content, stop_type, tokens, choice.index)
        if self.req.n_probs:
            body["completion_probabilities"] = self.probs(run, probs)
        return project(body, self.req.response_fields)

    async def sse(self, choice: Choice, run: Run) -> AsyncIterator[str]:
        """One choice's SSE: its optional `prompt_progress`, a chunk per round with text, the final object."""
        req, stop_type = self.req, "none"
        n_eval = run.started.n_prompt_tokens if run.started else 0
        rules = self.rules[choice.index]
        async for ch in run.events(bool(req.return_progress)):
            if not isinstance(ch, Chunk):  # the prompt is still being read
                yield self.waiting(choice, n_eval, ch)
                continue
            piece, stop_type = rules.verdict(ch)  # the editor rules, as `policed` applies them
            if piece or ch.step.tokens:  # a chunk's token ids come whatever return_tokens says, as llama-server's
                d = {"index": choice.index, "content": piece, "tokens": list(ch.step.tokens), "stop": False,
                     "id_slot": 0, "tokens_predicted": run.stats.n_generated, "tokens_evaluated": n_eval}
                if req.timings_per_token:
                    d["timings"] = run.timings
                if req.n_probs:
                    d["completion_probabilities"] = self.probs(run, ch.step.logprobs)
                yield sse_data(d)
            if stop_type != "none":
                break
        yield sse_data(self.final(run, "", stop_type, [], choice.index))

    def waiting(self, choice: Choice, n_eval: int, p: Progress | None) -> str:
        """What the stream sends while the prompt is read: llama-server's progress events when asked, else an SSE
        comment that keeps the connection alive."""
        if p is None or not self.req.return_progress:
            return SSE_KEEPALIVE
        return sse_data({"index": choice.index, "content": "", "tokens": [], "stop": False, "id_slot": 0,
                         "tokens_predicted": 0, "tokens_evaluated": n_eval,
                         **progress_fields(p, self.req.timings_per_token)})

    def probs(self, run: Run, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        post = run.job.params if self.req.post_sampling_probs else None
        return llama_probs(self.state.engine, lps, self.req.n_probs, post)

    def final(self, run: Run, content: str, stop_type: str, tokens: list[int], index: int) -> dict[str, Any]:
        """llama-server's last object of a choice (the whole answer, or the stream's `stop: true` event)."""
        state, s, started = self.state, run.stats, run.started
        return {"index": index, "content": content, "tokens": tokens if self.req.return_tokens else [],
                "id_slot": 0, "stop": True, "model": state.model_name, "tokens_predicted": s.n_generated,
                "tokens_evaluated": started.n_prompt_tokens if started else 0,
                "generation_settings": generation_settings(state, run, self.req),
                "prompt": _prompt_text(state.engine, started.prompt_tokens) if started else "",
                "tokens_cached": s.n_cached, "truncated": truncated(state, run),
                "has_new_line": "\n" in content, "stop_type": stop_type, "stopping_word": "",
                "timings": run.timings, "speculative": speculative(state, run)}


def truncated(state: State, run: Run) -> bool:
    """llama-server's `truncated`: the prompt was cut to fit, or the context shifted (the prompt and the answer
    went past the context, which only a shift allows; the last token sampled is not in the context)."""
    started = run.started
    if started is None:
        return False
    shifted = started.n_prompt_tokens + run.stats.n_generated - 1 > state.n_ctx
    return started.truncated or (state.config.context_shift and shifted)


def n_choices(req: CompletionRequest) -> int:
    """`n_cmpl` (or `n`), checked with llama-server's words: llama.vscode shows the message and, when it starts
    with "Field 'n_cmpl': Value must be between", tells the user which setting to change."""
    for name in ("n_cmpl", "n"):
        v = getattr(req, name)
        if v is not None:
            if not 1 <= v <= MAX_CHOICES:
                raise ApiError(400, f"Field '{name}': Value must be between 1 <= value <= {MAX_CHOICES}, but got {v}")
            return int(v)
    return 1


def generation_settings(state: State, run: Run, req: CompletionRequest) -> dict[str, Any]:
    """The sampling parameters this request actually ran with (llama-server's `generation_settings`)."""
    p = run.job.params
    d: dict[str, Any] = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)
                         if f.name not in ("constraint", "logprobs", "seed", "infill")}
    d.update(seed=-1 if p.seed is None else p.seed, n_predict=run.job.max_tokens, max_tokens=run.job.max_tokens,
             stop=list(run.job.stop), stream=req.stream, n_probs=req.n_probs, n_ctx=state.n_ctx,
             logit_bias=[[t, b] for t, b in _bias_pairs(req.logit_bias)], grammar=req.grammar or "",
             json_schema=req.json_schema, samplers=_chain_names(req.samplers),
             n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms, return_tokens=req.return_tokens,
             timings_per_token=req.timings_per_token, post_sampling_probs=req.post_sampling_probs,
             speculative={"drafter": state.engine.drafter_name, "k": spec_policy(state.engine)[0],
                          "allowed": bool(run.started and run.started.speculate)})
    return d


def _chain_names(samplers: list[str] | str | None) -> list[str]:
    """The steps this request ran (`generation_settings.samplers`): its list, or the default chain."""
    chain = parse_samplers(samplers)
    return chain.names if chain is not None else list(ORDER)


def _bias_pairs(v: Any) -> list[tuple[Any, Any]]:
    if isinstance(v, dict):
        return list(v.items())
    return [tuple(x) for x in v or [] if isinstance(x, list) and len(x) == 2]


def _prompt_text(e: Engine, tokens: tuple[int, ...]) -> str:
    """The prompt as the model saw it, special tokens written out (llama-server's `prompt`)."""
    t = e.target
    return b"".join(t.piece(i) or t.token_text(i).encode() for i in tokens).decode("utf-8", "replace")


def project(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
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
