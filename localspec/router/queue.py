"""The router's load queue: a model that cannot load now, because --models-max models run (or its memory is
taken) and every one of them is busy or loading, waits its turn, first in, first out, as llama-server's router
queues it (its server_lru_sched), instead of answering 503 at once.

One entry a model: the requests for a model share its one load task (pool.py), so two requests for the same model
wait in one place and need one eviction. Only the entry at the head may make room; when it has room it starts its
load and leaves the line, and the next one tries. A wait is bounded: past `wait_s` the caller gets WontFit (a 503
in its protocol's shape). A request whose caller hung up cancels its model's load task when it was the last one
waiting for it, which takes the entry out of the line.

Why an Event swapped on each change rather than an asyncio.Condition: the pool learns of a change in synchronous
code (a request's release runs from the proxy's callback), and a Condition can be notified only with its lock
held, which takes an await.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from .refusals import WontFit

QUEUE_WAIT_S = 600.0  # a request waits this long for room before its 503


class LoadQueue:
    """Models waiting for room to load, in the order their first request came."""

    def __init__(self, log: Callable[[str], None] = lambda _msg: None) -> None:
        self._line: list[str] = []
        self._changed = asyncio.Event()
        self.log = log

    @property
    def waiting(self) -> list[str]:
        """The models in line, the next one to load first."""
        return list(self._line)

    def changed(self) -> None:
        """Something that may make room happened (a request ended, a runner stopped or died, a load ended, an
        entry left): every waiter looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def turn(self, name: str, admit: Callable[[], Awaitable[str | None]], wait_s: float) -> None:
        """Wait in line until `name` is at the head and `admit()` lets it through: it makes room and starts the
        load (None), or says why it must wait for a busy model. WontFit after `wait_s` seconds with the last
        reason; `admit` may raise WontFit itself when waiting cannot help."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        why, said = f"cannot load {name}: {len(self._line)} models are ahead of it", False
        self._line.append(name)
        try:
            while True:
                changed = self._changed  # taken before looking: a change during `admit` is not missed
                if self._line[0] == name:
                    why = await admit() or ""
                    if not why:
                        return
                left = deadline - loop.time()
                if left <= 0:
                    raise WontFit(f"{why} (waited {wait_s:g} s in the load queue)")
                if not said:
                    self.log(f"router: {name} waits in the load queue, position {self._line.index(name) + 1} ({why})")
                    said = True
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
        except asyncio.CancelledError:
            self.log(f"router: {name} left the load queue (no request waits for it)")
            raise
        finally:
            self._line.remove(name)
            self.changed()
