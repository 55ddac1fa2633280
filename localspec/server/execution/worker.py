"""The one generation worker: a thread that owns the Engine and runs queued jobs one at a time.

llama contexts are not thread-safe, and batch-1 speculation gains nothing from interleaving requests, so every
call that touches a llama context (its KV cache, decoding, sampling state) happens on this thread: a job's
`build` (the FIM layout and tokenizing its prompt), tokenizing a text prompt, `Engine.generate` and the cache
rewind when it ends, and a job's `until` (the client's stop rule, checked after each round).

What runs on the event loop instead, and why that is safe: the calls that read only the model's vocabulary and
metadata, never a context. `/tokenize`, `/detokenize`, `/props`' token texts, `/completion`'s `prompt` and
`completion_probabilities` (token pieces), a chat request's prompt (the Jinja template is rendered in Python;
counting its system tokens for `--context-shift` tokenizes it), and building a request's constraint (a JSON
schema -> GBNF is Python; llama.cpp's grammar sampler is created over the vocabulary, a new object per job).
llama.cpp's vocabulary is read-only once the model is loaded and its tokenizer is reentrant (llama-server
tokenizes on its HTTP threads too, outside its generation loop); our Model's tokenize cache takes a lock and its
piece cache fills with the same bytes on either thread. So a /tokenize answers at once, even while a long
generation runs, and a bad grammar or template is a 400 before the job is queued.

A route submits a `Job` and reads its events from a per-job asyncio queue; a client that goes away sets
`job.cancel()`, which `Engine.generate` checks after each verify round, so the loop's `finally` rewinds the
caches to a consistent state.

Disable-by-load: when more than `spec_max_queue` jobs are waiting as a job starts, that job decodes plainly
(speculation spends compute that queued requests need) and says so in its `Started` event.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...engine.engine import Chunk, Engine
from ...engine.stats import Stats
from ...errors import LocalspecError
from ...sampling.params import SamplingParams
from ...speculative.drafters import common_prefix
from ..http import ApiError

log = logging.getLogger("localspec.server")

Prompt = str | list[int]
Build = Callable[[Engine], tuple[Prompt, bool]]  # runs on the worker: the prompt, and whether it was cut to fit


class ExceedContext(LocalspecError):
    """The prompt does not fit the context: llama-server's `exceed_context_size_error`, with its two numbers."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), "
                         "try increasing it (--ctx) or shortening the prompt")
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


@dataclass(frozen=True)
class Started:
    """First event of a job: the prompt is built and fits; its prefill begins."""

    n_prompt_tokens: int
    speculate: bool  # speculation allowed for this job (drafts may still not be made: see Stats.draft_n)
    reason: str  # why it is off ("" when on)
    truncated: bool = False
    queued_ms: float = 0.0
    prompt_tokens: tuple[int, ...] = ()
    n_cached: int = 0  # prompt tokens the cache holds already (the prefill reuses them; a recurrent state: fewer)


@dataclass(frozen=True)
class Progress:
    """The prompt's prefill has `processed` of its `total` tokens in the cache (`cache` of them reused): sent
    after each prefill batch of a streamed job, so a stream shows progress and stays alive through a long
    prompt (llama-server's `prompt_progress`)."""

    total: int
    cache: int
    processed: int
    time_ms: float


class PrefillCancelled(Exception):
    """A job cancelled between two prefill batches. The cache keeps the batches read so far (its tokens match
    its entries), so the job simply ends, and the next prompt may even reuse them."""


@dataclass(frozen=True)
class Failed:
    error: Exception


@dataclass(frozen=True)
class Done:
    pass


Event = Started | Progress | Chunk | Failed | Done


@dataclass
class Job:
    """One request. `build` runs on the worker and returns the prompt (text or tokens), plus whether it cut
    anything to fit; it may raise LocalspecError (bad input) before anything is generated."""

    build: Build
    params: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: Sequence[str] = ()
    speculate: bool = True  # the client's wish; load may still turn it off
    context_shift: bool = False  # --context-shift: a full context drops old tokens and goes on
    n_keep: int = 0  # tokens a shift keeps from the start (-1: the whole prompt)
    live: bool = True  # False (an answer sent whole): events reach the event loop at the end, in one wake-up
    until: Callable[[Chunk], bool] | None = None  # a client's stop rule, checked here before each chunk is sent
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended_by_server: bool = False  # cancelled because the server stops: its client still reads the answer
    t_submit: float = field(default_factory=time.perf_counter)
    first: Stats | None = None  # the stats after the first round (set by the worker before that chunk is sent)
    _prefill: tuple[int, float] | None = None  # (prompt tokens reused from the cache, when the prefill began)
    _loop: asyncio.AbstractEventLoop | None = None
    _events: asyncio.Queue | None = None
    _held: list[Event] = field(default_factory=list)  # events not yet sent (live=False)
    n_prompt_tokens: int = 0  # the prompt's tokens, once it is built
    id: int = 0  # the worker numbers its jobs as they are submitted (llama-server's `id_task`)
    n_decoded: int = 0  # tokens generated so far (llama-server's /slots `next_token.n_decoded`)

    def cancel(self) -> None:
        self.cancelled.set()

    def prefilled(self, n: int) -> None:
        """The prompt's prefill has `n` tokens in the cache: the reused prefix first, then after each batch
        (loop.prefill). A streamed job sends each as a Progress event (llama-server's `prompt_progress`)."""
        if self.cancelled.is_set():  # the client left (or the server stops) mid-prompt: the next job need not wait
            raise PrefillCancelled()
        now = time.perf_counter()
        if self._prefill is None:
            self._prefill = (n, now)  # the reused prefix, and when the prefill began
        cache, t0 = self._prefill
        if self.live and self.n_prompt_tokens:
            self._emit(Progress(self.n_prompt_tokens, cache, n, (now - t0) * 1e3))

    async def next_event(self, timeout: float | None = None) -> Event:
        assert self._events is not None, "job was not submitted"
        if timeout is None:
            return await self._events.get()
        return await asyncio.wait_for(self._events.get(), timeout)

    def _emit(self, ev: Event) -> None:
        """Send `ev` to the event loop. A job answered whole holds its Started and Chunk events until the end:
        nobody reads them before, and each wake-up of the event loop mid-pass puts its thread on a core that
        llama.cpp's threads are using."""
        if not self.live and isinstance(ev, (Started, Chunk)):
            self._held.append(ev)
            return
        events, self._held = [*self._held, ev], []
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._put, events)
            except RuntimeError:  # the loop closed between the check and the call (server shutting down)
                pass

    def _put(self, events: list[Event]) -> None:
        for ev in events:
            self._events.put_nowait(ev)  # type: ignore[union-attr]


class Worker:
    """Owns `engine`; `submit()` from the event loop, everything else happens on the worker thread."""

    def __init__(self, engine: Engine, *, spec_max_queue: int = 4,
                 on_finish: Callable[[Job, Started | None, Chunk | None, Exception | None], None] | None = None):
        self.engine = engine
        self.spec_max_queue = spec_max_queue
        self.on_finish = on_finish
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="localspec-generation", daemon=True)
        self.busy = False
        self.stopping = False
        self._current: Job | None = None
        self._submitted = 0

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def end_jobs(self) -> None:
        """The server is stopping (SIGTERM, a closed terminal): the job running now ends after its round, its
        answer sent as far as it got, and every job not yet started fails with a 503 in its protocol's shape.
        Only sets flags: a signal handler calls it."""
        self.stopping = True
        job = self._current
        if job is not None:
            job.ended_by_server = True
            job.cancel()

    @property
    def current(self) -> Job | None:
        """The job running now (None: idle), for llama-server's /slots."""
        return self._current

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        self._submitted += 1
        job.id = self._submitted
        job._loop = loop or asyncio.get_running_loop()
        job._events = asyncio.Queue()
        self._jobs.put(job)
        return job

    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- worker thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.busy, self._current = True, job
            try:
                self._run_job(job)
            except BaseException:  # never let one request kill the worker
                log.exception("generation worker: unexpected error")
            finally:
                self.busy, self._current = False, None

    def _run_job(self, job: Job) -> None:
        started: Started | None = None
        last: Chunk | None = None
        error: Exception | None = None
        try:
            if self.stopping and not job.ended_by_server:
                raise ApiError(503, "the server is stopping", "unavailable_error")
            if job.cancelled.is_set():
                return
            waiting = self._jobs.qsize()
            speculate, reason = self._speculate(job, waiting)
            prompt, truncated = job.build(self.engine)
            tokens = self.engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
            if not tokens:
                raise ValueError("empty prompt: nothing to condition on")
            if len(tokens) >= self.engine.target.n_ctx:
                raise ExceedContext(len(tokens), self.engine.target.n_ctx)
            # the prompt fits: the answer begins now, before its prefill, so a client sees its head at once
            cached = min(common_prefix(self.engine.target.tokens, tokens), len(tokens) - 1)
            started = Started(len(tokens), speculate, reason, truncated, (time.perf_counter() - job.t_submit) * 1e3,
                              tuple(tokens), cached)
            job.n_prompt_tokens = len(tokens)
            job._emit(started)
            gen = self.engine.generate(tokens, params=job.params, max_tokens=job.max_tokens, stop=job.stop,
                                       speculate=speculate, should_stop=job.cancelled.is_set,
                                       context_shift=job.context_shift, n_keep=job.n_keep, progress=job.prefilled)
            first = True
            with closing(gen):  # leaving early (job.until) rewinds the caches now
                for chunk in gen:
                    if first:
                        job.first = chunk.stats
                        first = False
                    last = chunk
                    job.n_decoded = chunk.stats.n_generated
                    ends = job.until is not None and job.until(chunk)  # before the send: the loop reads its verdict
                    job._emit(chunk)
                    if ends:
                        break  # the client's rule ends it here: no round past it for the next request to wait on
        except PrefillCancelled:
            pass
        except (LocalspecError, ValueError) as e:  # bad input: a 4xx for the client
            error = e
        except Exception as e:  # a bug: logged, reported as 500, the worker lives on
            log.exception("generation failed")
            error = e
        finally:
            if error is not None:
                job._emit(Failed(error))
            job._emit(Done())
            if self.on_finish is not None:
                try:
                    self.on_finish(job, started, last, error)
                except Exception:
                    log.exception("metrics hook failed")

    def _speculate(self, job: Job, waiting: int) -> tuple[bool, str]:
        if self.engine.drafter is None:
            return False, "no drafter (--no-spec)"
        if not job.speculate:
            return False, "off by request"
        if waiting > self.spec_max_queue:
            return False, f"queue {waiting} > {self.spec_max_queue}"
        return True, ""
