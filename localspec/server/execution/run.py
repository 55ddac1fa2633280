"""A request's generations seen from the event loop: `plan` numbers its (prompt, choice) pairs, `Run` follows
one job (cancelled when the client hangs up), and `Choices` runs them one after another — the one loop every
protocol module answers with, whole or streamed."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

from fastapi import Request

from ...engine.engine import Chunk
from ...engine.stats import Stats
from ...errors import LocalspecError
from ..http import ApiError, ClientGone
from ..request.schemas import MAX_RESULTS
from ..state import State
from .timings import timings
from .worker import Build, Done, ExceedContext, Failed, Job, Progress, Started

KEEPALIVE_S = 10.0  # a stream sends its protocol's keep-alive after this long without a byte


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
    kind = "exceed_context_size_error" if isinstance(e, ExceedContext) else getattr(e, "kind", "invalid_request_error")
    return {"error": {"code": getattr(e, "status", 400), "message": str(e), "type": kind}}


def sse_data(obj: dict[str, Any]) -> str:
    """One server-sent event, as llama-server and OpenAI write them: `data: {json}` and a blank line."""
    return f"data: {json.dumps(obj)}\n\n"


SSE_KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: every SSE reader skips it, and the connection stays busy


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

    async def _event(self, timeout: float | None = None) -> Started | Progress | Chunk | None:
        ev = await self.job.next_event(timeout)
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
        """The answer's chunks (an answer sent whole, or a stream that needs no keep-alive)."""
        async for ev in self._events(None, False):
            if isinstance(ev, Chunk):
                yield ev

    def events(self, progress: bool = False) -> AsyncIterator[Chunk | Progress | None]:
        """The chunks, and before the first one None whenever KEEPALIVE_S seconds passed without a yield: a stream
        sends its protocol's keep-alive for it, so a client's idle watchdog does not give up on a long prompt.
        `progress`: the prefill's Progress events too (llama-server's `return_progress`), the last one the whole
        prompt."""
        return self._events(KEEPALIVE_S, progress)

    async def _events(self, every: float | None, progress: bool) -> AsyncIterator[Chunk | Progress | None]:
        loop = asyncio.get_running_loop()
        shown: Progress | None = None
        said = loop.time()  # when this stream last yielded
        try:
            while True:
                wait = None if every is None or self.last is not None else max(0.0, said + every - loop.time())
                try:
                    ev = await self._event(wait)
                except asyncio.TimeoutError:
                    said = loop.time()
                    yield None
                    continue
                if ev is None:
                    return
                if isinstance(ev, Progress):
                    if progress:
                        shown, said = ev, loop.time()
                        yield ev
                    continue
                assert isinstance(ev, Chunk)
                if shown is not None and shown.processed < shown.total:  # the last tokens went with the first round
                    shown = Progress(shown.total, shown.cache, shown.total, ev.stats.prompt_ms)
                    yield shown
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
    def cancelled(self) -> bool:
        """The client hung up before the job finished: nobody reads an answer (a 499)."""
        return self.last is not None and self.last.finish == "cancelled" and not self.job.ended_by_server

    @property
    def stats(self) -> Stats:
        return self.last.stats if self.last else Stats()

    @property
    def timings(self) -> dict[str, Any]:
        return timings(self.stats)


class Choices:
    """A request's choices (`plan`), run one after another on the one worker. `start()` starts the first, so a
    client gone before it is a 499 and a prompt too long a 400 before any answer begins; `each()` then yields
    every (choice, started run) in answer order (later jobs are made and started as their turn comes), and
    `streamed()` turns them into one event stream. `runs` holds the runs started so far."""

    def __init__(self, state: State, request: Request, choices: list[Choice], job: Callable[[Choice], Job]) -> None:
        self.state, self.request, self.plan, self.job = state, request, choices, job
        self.runs: list[tuple[Choice, Run]] = []
        self._first: Run | None = None

    async def _start(self, choice: Choice) -> Run:
        # in a thread: making a job builds its grammar (a schema's conversion, the bounds check, llama.cpp's
        # parse), seconds for a large one, which would hold every other request's event loop
        run = Run(self.state, await asyncio.to_thread(self.job, choice), self.request)
        await run.start()
        return run

    async def start(self) -> Run:
        self._first = await self._start(self.plan[0])
        return self._first

    async def each(self) -> AsyncIterator[tuple[Choice, Run]]:
        """Every choice with its started run; a later choice that cannot start raises (the request's error)."""
        for i, choice in enumerate(self.plan):
            run = self._first if i == 0 and self._first is not None else await self._start(choice)
            self.runs.append((choice, run))
            yield choice, run

    @property
    def complete(self) -> bool:
        """Every choice ran (a stream cut short by a failed start sends no closing events)."""
        return len(self.runs) == len(self.plan)

    async def streamed(self, render: Callable[[Choice, Run], AsyncIterator[str]]) -> AsyncIterator[str]:
        """Each choice's events from `render`, in turn. A later choice that cannot start ends the stream with
        llama-server's error event (a client gone: with nothing); failures while rendering propagate."""
        runs = self.each()
        while True:
            try:
                choice, run = await anext(runs)
            except (StopAsyncIteration, ClientGone):
                return
            except LocalspecError as e:
                yield sse_data(error_event(e))
                return
            async for event in render(choice, run):
                yield event
