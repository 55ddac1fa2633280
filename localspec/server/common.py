"""What the three protocol modules share: server state, request limits, the job runner with disconnect
handling, and the statistics blocks (llama-server's `timings`, our `speculative`) every response carries.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

from fastapi import Request

from ..engine.engine import Chunk, Engine
from ..engine.stats import Stats
from ..errors import LocalspecError
from ..sampling.params import SamplingParams
from .metrics import Metrics
from .schemas import MAX_RESULTS
from .worker import Done, Failed, Job, Prompt, Started, Worker


class ApiError(LocalspecError):
    """A client error with its HTTP status; the app renders it in the protocol's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class ClientGone(Exception):
    """The client disconnected before its job started; nobody is left to answer."""


@dataclass(frozen=True)
class ServerConfig:
    api_key: str | None = None
    spec_max_queue: int = 4  # more waiting jobs than this -> plain decoding for the job that starts
    max_predict: int | None = None  # cap on generated tokens per request (None = the context)
    alias: str | None = None  # the model name every response, /v1/models and /api/tags report
    cors_origins: str = "localhost"  # "localhost" (reflect local origins, llama-server's rule), "*", or a list
    aliases: tuple[str, ...] = ()  # more names the model answers to (llama-server's comma-separated --alias)
    tags: tuple[str, ...] = ()  # llama-server's --tags: informational, listed in /v1/models
    n_predict: int | None = None  # llama-server's -n: tokens a request generates when it does not say
    context_shift: bool = False  # llama-server's --context-shift: off by default, as there


class State:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = Metrics()
        self.worker = Worker(engine, spec_max_queue=config.spec_max_queue, on_finish=self.metrics.job_done)
        self.started_at = time.time()
        p = engine.target.path
        self.model_names = {n for n in (engine.name, p.name, p.stem, config.alias, *config.aliases) if n}

    @property
    def n_ctx(self) -> int:
        return self.engine.target.n_ctx

    @property
    def model_name(self) -> str:
        """The name clients see: the first --alias, else the served model's."""
        return self.config.alias or next(iter(self.config.aliases), "") or self.engine.name

    @property
    def aliases(self) -> list[str]:
        """Every --alias, the reported name first (llama-server's `aliases`)."""
        names = [n for n in (self.config.alias, *self.config.aliases) if n]
        return list(dict.fromkeys(names)) or [self.engine.name]

    def check_model(self, name: str | None) -> None:
        """Ollama's routes only (its clients expect a 404 for a model that is not there; /v1/* and the
        llama.cpp routes serve the loaded model whatever the name, as llama-server and LM Studio do).
        Empty means the served model; Ollama's ':latest' tag is accepted."""
        if not name:
            return
        if name in self.model_names or name.removesuffix(":latest") in self.model_names:
            return
        raise ApiError(404, f"model '{name}' not found; this server serves '{self.model_name}' "
                            "(GET /api/tags lists it)", "not_found_error")

    def budget(self, requested: int | None, name: str = "n_predict") -> int:
        """Tokens to generate: None/-1 (or more than the context holds) = until EOS or a full context,
        which ends with finish_reason "length" as in llama-server; capped by --max-predict."""
        if requested is not None and requested < -2:
            raise ApiError(400, f"{name} must be >= -1 (-1 = until the context is full), got {requested}")
        if requested is None:  # llama-server's -n is the default, not a cap
            requested = self.config.n_predict
        over = requested is not None and requested > self.n_ctx and not self.config.context_shift
        n = self.n_ctx if requested is None or requested < 0 or over else requested  # a shift makes room
        cap = self.config.max_predict
        return min(n, cap) if cap else n


Build = Callable[[Engine], tuple[Prompt, bool]]  # runs on the worker: the prompt, and whether it was cut to fit


@dataclass(frozen=True)
class Choice:
    """One generation of a request: prompt p's j-th of n choices has index p * n + j (llama-server's order).
    The n choices of a prompt run one after another on the one worker, so each after the first finds the
    prompt in the KV cache (common-prefix prefill) and evaluates only its last token."""

    index: int
    build: Build
    seed: int | None  # the request's seed + j: choices differ, and each is reproducible


def plan(builds: Sequence[Build], n: int, seed: int | None) -> list[Choice]:
    """Every (prompt, choice) of a request, in answer order (at most MAX_RESULTS: they run one at a time)."""
    if len(builds) * n > MAX_RESULTS:
        raise ApiError(400, f"{len(builds)} prompts x {n} choices = {len(builds) * n} generations; at most "
                            f"{MAX_RESULTS} per request")
    base = None if seed is None or seed < 0 else seed
    return [Choice(p * n + j, b, None if base is None else base + j) for p, b in enumerate(builds) for j in range(n)]


def error_event(e: Exception) -> dict[str, Any]:
    """A failure after a stream began (a later prompt that does not fit): llama-server's error object."""
    from .worker import ExceedContext

    kind = "exceed_context_size_error" if isinstance(e, ExceedContext) else getattr(e, "kind", "invalid_request_error")
    return {"error": {"code": getattr(e, "status", 400), "message": str(e), "type": kind}}


PENALTIES = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")


def sampling(temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
             seed: int | None, *, defaults: dict[str, float], penalties: Any = None,
             **extra: Any) -> SamplingParams:
    """Protocol defaults filled in; top_p 0 means "off" in some clients, as does seed -1. `penalties`: the
    request (or Ollama options) object carrying repeat_penalty & co; `extra`: request-level fields (logprobs,
    constraint)."""
    get = lambda v, k: defaults.get(k, 0) if v is None else v  # noqa: E731
    tp = float(get(top_p, "top_p") or 1.0)
    for name in PENALTIES:
        v = getattr(penalties, name, None)
        if v is not None or name in defaults:
            extra[name] = v if v is not None else defaults[name]
    try:
        return SamplingParams(temperature=float(get(temperature, "temperature")), top_k=int(get(top_k, "top_k")),
                              top_p=tp, min_p=float(get(min_p, "min_p")),
                              seed=None if seed is None or seed < 0 else int(seed), **extra)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)


class Run:
    """One job seen from the event loop: `await start()`, then `async for chunk in chunks()`.
    Leaving early (client gone, a stop rule) cancels the job; the worker ends it after the current round."""

    def __init__(self, state: State, job: Job, request: Request) -> None:
        self.state = state
        self.job = job
        self.request = request
        self.started: Started | None = None
        self.last: Chunk | None = None
        self._watcher: asyncio.Task | None = None

    async def _event(self) -> Started | Chunk | None:
        ev = await self.job.next_event()
        if isinstance(ev, Failed):
            raise ev.error
        return None if isinstance(ev, Done) else ev

    async def _watch_client(self) -> None:
        """Cancel the job the moment the client hangs up (the ASGI server's `http.disconnect`, which also
        comes once the answer is sent): editors abandon /infill on each keystroke, and the next request
        should wait at most the verify round in flight, not a polling interval."""
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.job.cancel()

    async def start(self) -> Started:
        self.state.worker.submit(self.job)
        self._watcher = asyncio.create_task(self._watch_client())
        try:
            ev = await self._event()
        except BaseException:
            self.close()
            raise
        if ev is None:
            self.close()
            raise ClientGone()
        assert isinstance(ev, Started)
        self.started = ev
        return ev

    async def chunks(self) -> AsyncIterator[Chunk]:
        try:
            while True:
                ev = await self._event()
                if ev is None:
                    return
                assert isinstance(ev, Chunk)
                self.last = ev
                yield ev
                if ev.finish:
                    return
        finally:
            self.close()

    def close(self) -> None:
        """Stop the job (a no-op when it is over; ends it when the consumer left early) and the watcher."""
        self.job.cancel()
        if self._watcher is not None:
            self._watcher.cancel()

    @property
    def stats(self) -> Stats:
        return self.last.stats if self.last else Stats()

    @property
    def timings(self) -> dict[str, Any]:
        return timings(self.stats, self.job.first)


def predicted_rate(s: Stats, first: Stats | None) -> float:
    """Generated tokens per second after the first round, as llama-server counts it: its first token comes out
    of the pass that evaluates the prompt's last token (prompt time), ours out of the first verify round."""
    if first is None or s.n_generated <= first.n_generated or s.gen_ms <= first.gen_ms:
        return s.tokens_per_second
    return (s.n_generated - first.n_generated) / ((s.gen_ms - first.gen_ms) / 1e3)


def progress(first: Stats) -> dict[str, Any]:
    """llama-server's `prompt_progress` once the prompt is in the cache (one event: one prefill)."""
    total = first.n_prompt + first.n_cached
    return {"total": total, "cache": first.n_cached, "processed": total, "time_ms": first.prompt_ms}


def timings(s: Stats, first: Stats | None = None) -> dict[str, Any]:
    """llama-server's `timings` block, plus its speculative counters."""
    return {
        "cache_n": s.n_cached,
        "prompt_n": s.n_prompt,
        "prompt_ms": s.prompt_ms,
        "prompt_per_token_ms": s.prompt_ms / s.n_prompt if s.n_prompt else 0.0,
        "prompt_per_second": s.prompt_per_second,
        "predicted_n": s.n_generated,
        "predicted_ms": s.gen_ms,
        "predicted_per_token_ms": s.gen_ms / s.n_generated if s.n_generated else 0.0,
        "predicted_per_second": predicted_rate(s, first),
        "draft_n": s.draft_n,
        "draft_n_accepted": s.draft_n_accepted,
    }


def spec_policy(engine: Engine) -> tuple[str, int]:
    """(how γ is chosen: "auto" or the pinned γ, γ in use now; 0 = off). The one place the server reads the
    engine's draft-length policy."""
    if engine.drafter is None:
        return "off", 0
    return engine.controller.policy()


def speculative(state: State, run: "Run") -> dict[str, Any]:
    """Our extra field: did this request draft (`enabled`: drafts were actually made), why not, and how well
    it did. `mode` and `k` follow the one rule every front end uses (`outcome.outcome`): k is the γ the
    controller chose in most of this request's rounds; `k_policy` says how γ is chosen."""
    s, started = run.stats, run.started
    out = run.last.outcome if run.last else None
    policy, _ = spec_policy(state.engine)
    d: dict[str, Any] = {"enabled": s.draft_n > 0, "mode": out.mode if out else "plain",
                         "drafter": state.engine.drafter_name, "k_policy": policy, "k": out.k if out else 0,
                         "draft_n": s.draft_n, "draft_n_accepted": s.draft_n_accepted,
                         "acceptance_rate": s.acceptance_rate,
                         "mean_acceptance_length": s.mean_acceptance_length,
                         "tokens_per_second": s.tokens_per_second, "ttft_ms": s.ttft_ms}
    if not s.draft_n:
        d["reason"] = _no_draft_reason(state, started)
    return d


def _no_draft_reason(state: State, started: Started | None) -> str:
    if started is None:
        return "not started"
    if not started.speculate:
        return started.reason
    reason = state.engine.controller.state().spec_disabled_reason
    if reason:
        return reason
    return "no draft was proposed (prompt lookup found no match, or the request ended first)"


def chat_text(content: str | list[dict[str, Any]] | None) -> str:
    """OpenAI content may be a list of parts; keep the text ones."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")


def chat_prompt(engine: Engine, messages: list[dict[str, str]]) -> tuple[str, bool]:
    from ..engine.engine import ChatTemplateError

    try:
        return engine.chat_prompt(messages), False
    except ChatTemplateError as e:
        raise ApiError(400, str(e)) from None
