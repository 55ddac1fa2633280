"""One model's place in the router's pool (pool.py): its state, the one llama-server's router reports (unloaded,
loading, loaded, sleeping, failed), its runner, its requests and idle deadlines, and the report GET /models and
/api/ps give of it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .discover import ModelSpec
from .memory import Estimate
from .process import Runner

UNLOADED, LOADING, LOADED, SLEEPING, FAILED = "unloaded", "loading", "loaded", "sleeping", "failed"


@dataclass(frozen=True)
class ModelStatus:
    """One model as GET /models and /api/ps report it."""

    name: str
    state: str
    pid: int | None
    port: int | None
    expires_at: float | None  # time.time() when it unloads or sleeps if still idle; None: never, or not loaded
    size_bytes: int | None
    ram_estimate: int | None
    vram_estimate: int | None
    busy: int
    failure: str | None
    source: str
    path: str | None


class Slot:
    """A model's mutable state; only the Pool (pool.py) changes it."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.runner: Runner | None = None
        self.state = UNLOADED
        self.busy = 0
        self.keep_alive: float | None = None  # the last request's; None: the pool's default
        self.expires: float | None = None  # time.monotonic() deadlines while idle
        self.sleep_at: float | None = None
        self.last_used = 0.0
        self.loading: asyncio.Task[Runner] | None = None
        self.failure: str | None = None
        self.need: Estimate | None = None
        self.estimated = False
        self.waiting = 0  # requests waiting for its load

    def report(self, now: float, wall: float) -> ModelStatus:
        """What GET /models and /api/ps say of it; `now` on the monotonic clock, `wall` the same moment's time."""
        r = self.runner
        deadlines = [d for d in (self.expires, self.sleep_at) if d is not None]
        expires = wall + (min(deadlines) - now) if deadlines and r is not None else None
        path = self.spec.path
        size = path.stat().st_size if path is not None and path.is_file() else None
        need = self.need if self.estimated else None
        return ModelStatus(self.spec.name, self.state, r.pid if r else None, r.port if r else None, expires, size,
                           need.ram_bytes if need else None, need.vram_bytes if need else None, self.busy,
                           self.failure if self.state == FAILED else None, self.spec.source,
                           str(path) if path is not None else None)
