"""Which models run: one Runner per model, started on demand, kept while in use, evicted least-recently-used
past --models-max or when a new model's memory estimate would not fit, unloaded when idle.

Each model is a slot in the states llama-server's router reports: unloaded -> loading -> loaded, loaded ->
sleeping (--sleep-idle-seconds) or unloaded (keep_alive expired, evicted, unloaded by request), and failed (its
runner did not start or died; the next request starts it again). Requests hold a runner between `acquire` and
`release`, and a runner serving a request is never evicted or expired. Idle time follows Ollama's keep_alive:
the expiry is set when the last request on a model ends (now + keep_alive; 0 unloads at once; negative keeps
it forever), and --sleep-idle-seconds puts any model to sleep after that long idle. Everything runs on the
event loop; loads of different models run side by side, one load at a time per model, and only admitting a
load (eviction, the memory check) is serialised: by the load queue (queue.py), where a model waits, first in,
first out, while the models that hold its room are busy.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Coroutine, Iterable

from ..backend.memory import available_bytes
from ..errors import LocalspecError
from .discover import ModelSpec, canonical
from .memory import Estimate, fits, free_vram_bytes, gb, refusal, spec_estimate
from .process import START_TIMEOUT, Runner
from .queue import QUEUE_WAIT_S, LoadQueue
from .refusals import RunnerFailed, UnknownModel, WontFit
from .slot import FAILED, LOADED, LOADING, SLEEPING, UNLOADED, ModelStatus, Slot

MODELS_MAX = 4
DEFAULT_KEEP_ALIVE = 300.0  # Ollama's OLLAMA_KEEP_ALIVE default, 5 minutes
REAP_EVERY = 1.0


class Pool:
    """The runners of a router (see the module docstring)."""

    def __init__(self, specs: dict[str, ModelSpec] | Iterable[ModelSpec], *, models_max: int = MODELS_MAX,
                 sleep_idle_s: float | None = None, default_keep_alive: float | None = DEFAULT_KEEP_ALIVE,
                 estimate: Callable[[ModelSpec], Estimate | None] = spec_estimate,
                 available: Callable[[], int | None] = available_bytes,
                 available_vram: Callable[[], int | None] = free_vram_bytes, log: Callable[[str], None] | None = None,
                 env: dict[str, str] | None = None, server_args: tuple[str, ...] = (),
                 echo: Callable[[str, str], None] | None = None, start_timeout: float = START_TIMEOUT,
                 queue_wait_s: float = QUEUE_WAIT_S) -> None:
        values = specs.values() if isinstance(specs, dict) else specs
        self.specs = {s.name: s for s in values}
        self.models_max = max(1, models_max)
        self.sleep_idle_s = sleep_idle_s
        self.default_keep_alive = default_keep_alive
        self.estimate = estimate
        self.available = available
        self.available_vram = available_vram  # asked only for a model with layers on the GPU
        self.log = log or (lambda _msg: None)
        self.env = dict(env or {})
        self.server_args = tuple(server_args)
        self.echo = echo  # (model name, line) for each line a runner prints
        self.start_timeout = start_timeout
        self.queue_wait_s = queue_wait_s
        self._slots = {n: Slot(s) for n, s in self.specs.items()}
        self._retired: dict[str, Slot] = {}  # gone from the catalog, stopped when their requests end
        self._queue = LoadQueue(self.log)
        self._tasks: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None

    # -- names --------------------------------------------------------------------------------------------------

    def known(self) -> list[str]:
        return list(self.specs)

    def resolve(self, name: str) -> str:
        """The model a client's name means (exact, without ':latest', an alias); UnknownModel lists the rest."""
        found = canonical(name, self.specs)
        if found is None:
            raise UnknownModel(name, self.known())
        return found

    def update(self, specs: dict[str, ModelSpec] | Iterable[ModelSpec]) -> None:
        """A new catalog (after a pull, a delete, or GET /models?reload=1 after editing the presets file): new
        names get slots; a model whose settings changed, or whose name is gone, stops its runner now, or when
        its requests end (as llama-server's reload does), so its next request starts it with the new ones."""
        values = list(specs.values() if isinstance(specs, dict) else specs)
        self.specs = {s.name: s for s in values}
        for name in [n for n in self._slots if n not in self.specs]:
            slot = self._slots.pop(name)
            if slot.loading is not None:
                slot.loading.cancel()
            if slot.busy:
                self._retired[name] = slot
                slot.keep_alive = 0
            else:
                self._spawn(self._stop(slot, UNLOADED, "no longer in the catalog"))
        for name, spec in self.specs.items():
            slot = self._slots.setdefault(name, Slot(spec))
            changed = slot.spec != spec
            slot.spec, slot.estimated = spec, slot.estimated and not changed
            if changed and slot.runner is not None:
                if slot.busy:
                    slot.keep_alive = 0
                else:
                    self._spawn(self._stop(slot, UNLOADED, "its settings changed"))

    def loaded(self) -> list[str]:
        return [n for n, s in self._slots.items() if s.state == LOADED and s.runner is not None]

    def queued(self) -> list[str]:
        """The models waiting for room to load, the next one first."""
        return self._queue.waiting

    # -- requests -----------------------------------------------------------------------------------------------

    async def acquire(self, name: str, keep_alive: float | None = None) -> Runner:
        """A running runner for the model, started if need be (after its turn in the load queue); the caller
        must `release` it. Raises UnknownModel, WontFit (no room after queue_wait_s, or none that waiting could
        make) or RunnerFailed (it would not start)."""
        slot = self._slots[self.resolve(name)]
        return self._take(slot, await self._ready(slot), keep_alive)  # no await in between: nothing evicts it

    @staticmethod
    def _take(slot: Slot, runner: Runner, keep_alive: float | None) -> Runner:
        slot.busy += 1
        slot.expires = slot.sleep_at = None
        if keep_alive is not None:
            slot.keep_alive = keep_alive
        return runner

    def release(self, runner: Runner, keep_alive: float | None = None) -> None:
        """The request on `runner` is done; when it was the model's last, its idle clock starts (keep_alive as
        Ollama's: seconds, 0 = unload now, negative = never; None = the last one given, else the default)."""
        slot = self._slots.get(runner.name) or self._retired[runner.name]
        slot.busy = max(0, slot.busy - 1)
        if slot.busy == 0 and self._retired.get(runner.name) is slot:
            del self._retired[runner.name]
        if keep_alive is not None:
            slot.keep_alive = keep_alive
        slot.last_used = time.monotonic()
        if slot.runner is runner and not runner.alive:
            self._mark_dead(slot)
        elif slot.busy == 0 and slot.runner is runner:
            self._idle(slot)
        self._queue.changed()

    async def load(self, name: str) -> Runner:
        """POST /models/load: start the model (if it is not running) and leave it idle."""
        slot = self._slots[self.resolve(name)]
        runner = await self._ready(slot)
        if slot.busy == 0:
            self._idle(slot)
        return runner

    async def unload(self, name: str) -> bool:
        """POST /models/unload, Ollama's keep_alive 0: stop the model now, or when its requests end if it is
        serving some. False when it was not running."""
        slot = self._slots[self.resolve(name)]
        if slot.loading is not None and slot.runner is not None:  # a model still in the load queue is not running
            try:
                await asyncio.shield(slot.loading)
            except Exception:
                return False
        if slot.runner is None:
            return False
        if slot.busy:
            slot.keep_alive = 0
            return True
        await self._stop(slot, UNLOADED, "unloaded on request")
        return True

    # -- loading ------------------------------------------------------------------------------------------------

    async def _ready(self, slot: Slot) -> Runner:
        """The slot's live runner, or the one its (shared) load task starts."""
        r = slot.runner
        if r is not None and slot.state == LOADED and r.alive:
            return r
        if slot.loading is None:
            if r is not None and slot.state == LOADED:
                self._mark_dead(slot)
            slot.loading = self._spawn(self._load(slot))
        slot.waiting += 1  # between the load's end and the caller's busy += 1, nothing may evict it
        try:
            return await asyncio.shield(slot.loading)  # a waiter that goes away leaves the load to the others
        finally:
            slot.waiting -= 1
            if not slot.waiting and slot.loading is not None and slot.runner is None:
                slot.loading.cancel()  # the last waiter left while its model was still in the load queue

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed load nobody waits for is not "never retrieved"

    async def _load(self, slot: Slot) -> Runner:
        name = slot.spec.name
        try:
            await self._queue.turn(name, lambda: self._admit(slot), self.queue_wait_s)
            runner = slot.runner
            assert runner is not None
            self.log(f"router: loading {name}")
            await runner.start()
        except RunnerFailed as e:
            slot.runner, slot.state, slot.failure = None, FAILED, str(e)
            self.log(f"router: {name} failed to load: {e}")
            raise
        except BaseException:
            if slot.state == LOADING:
                slot.runner, slot.state = None, UNLOADED
            raise
        finally:
            slot.loading = None
            self._queue.changed()
        slot.state = LOADED
        self._idle(slot)  # its idle clock runs until a request takes it (one whose client left may never come)
        self.log(f"router: {name} loaded (pid {runner.pid}, {runner.url})")
        return runner

    async def _admit(self, slot: Slot) -> str | None:
        """At the head of the load queue: make room and give the slot its runner (None), or say why it must wait
        for a busy model. WontFit at once when nothing else runs, so that waiting cannot make room."""
        try:
            await self._make_room(slot)
        except WontFit as e:
            if not self._running(slot):
                raise
            return str(e)
        name, echo = slot.spec.name, self.echo
        runner = Runner(name, (*slot.spec.args, *self.server_args), env=self.env,
                        on_line=(lambda line: echo(name, line)) if echo is not None else None,
                        start_timeout=self.start_timeout)
        slot.runner, slot.state, slot.failure = runner, LOADING, None
        return None

    def _running(self, but: Slot) -> list[Slot]:
        return [s for s in self._slots.values() if s is not but and s.runner is not None
                and s.state in (LOADING, LOADED)]

    def _lru_idle(self, but: Slot) -> Slot | None:
        idle = [s for s in self._running(but) if s.state == LOADED and not s.busy and not s.waiting
                and s.loading is None]
        return min(idle, key=lambda s: s.last_used, default=None)

    def _need(self, slot: Slot) -> Estimate | None:
        if not slot.estimated:
            try:
                slot.need = self.estimate(slot.spec)
            except (OSError, ValueError, LocalspecError) as e:  # an unreadable header: the runner's load says why
                self.log(f"router: no memory estimate for {slot.spec.name}: {e}")
                slot.need = None
            slot.estimated = True
        return slot.need

    async def _make_room(self, slot: Slot) -> None:
        """Evict least-recently-used idle models until this one fits: fewer than models_max running, its RAM
        estimate under the memory available, its VRAM estimate (with --ngl) under the GPUs' free memory.
        WontFit when only busy models are left to evict."""
        name, m = slot.spec.name, self.models_max
        await self._evict_until(slot, lambda: len(self._running(slot)) < m, f"--models-max {m}", lambda: (
            f"cannot load {name}: {len(self._running(slot))} models are running and busy (--models-max {m})"))
        need = self._need(slot)
        if need is None:
            return
        for what, wanted, free in (("memory", need.ram_bytes, self.available),
                                   ("GPU memory", need.vram_bytes, self.available_vram)):
            if wanted:
                await self._evict_until(slot, lambda: fits(wanted, free()), f"{what}: needs {gb(wanted)}",
                                        lambda: refusal(name, what, wanted, free(), slot.spec.n_ctx))

    async def _evict_until(self, slot: Slot, fits: Callable[[], bool], why: str, refusal: Callable[[], str]) -> None:
        while not fits():
            victim = self._lru_idle(slot)
            if victim is None:
                raise WontFit(refusal())
            stop = self._spawn(self._stop(victim, UNLOADED, f"evicted for {slot.spec.name} ({why})"))
            await asyncio.shield(stop)  # a waiter that leaves the queue does not cut an eviction short

    # -- unloading ----------------------------------------------------------------------------------------------

    def _idle(self, slot: Slot) -> None:
        """The model's last request ended: set when it unloads (keep_alive) or sleeps (--sleep-idle-seconds)."""
        now = time.monotonic()
        slot.last_used = now
        ka = self.default_keep_alive if slot.keep_alive is None else slot.keep_alive
        slot.expires = None if ka is None or ka < 0 else now + ka
        slot.sleep_at = None if self.sleep_idle_s is None else now + self.sleep_idle_s
        if ka == 0 and not slot.waiting:
            self._spawn(self._stop(slot, UNLOADED, "keep_alive 0"))

    def _mark_dead(self, slot: Slot) -> None:
        """Its runner died (a crash mid-request): failed, with the cause; the next acquire starts it again."""
        r = slot.runner
        slot.failure = (r.failure() if r else None) or "runner exited"
        slot.runner, slot.state, slot.expires, slot.sleep_at = None, FAILED, None, None
        self.log(f"router: {slot.spec.name}: {slot.failure}")
        self._queue.changed()

    async def _stop(self, slot: Slot, state: str, why: str) -> None:
        """Stop the slot's runner (the caller checked that no request holds it)."""
        r = slot.runner
        if r is None:
            return
        slot.runner, slot.state, slot.expires, slot.sleep_at = None, state, None, None
        slot.keep_alive = None
        self.log(f"router: stopping {slot.spec.name} ({why})")
        try:
            await r.stop()
        finally:
            self._queue.changed()  # its memory is free now

    async def reap(self) -> None:
        """One pass: mark dead runners failed, put idle ones to sleep or unload them when their time is up."""
        now = time.monotonic()
        for slot in list(self._slots.values()):
            r = slot.runner
            if r is None or slot.loading is not None or slot.state != LOADED or slot.waiting:
                continue
            if not r.alive:
                self._mark_dead(slot)
            elif slot.busy == 0 and slot.sleep_at is not None and now >= slot.sleep_at:
                await self._stop(slot, SLEEPING, f"idle {self.sleep_idle_s:g} s")
            elif slot.busy == 0 and slot.expires is not None and now >= slot.expires:
                await self._stop(slot, UNLOADED, "keep_alive expired")

    async def run_reaper(self, every: float = REAP_EVERY) -> None:
        """Reap every `every` seconds until cancelled (the router's app runs it as a task)."""
        while True:
            await self.reap()
            await asyncio.sleep(every)

    def start_reaper(self) -> asyncio.Task:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self.run_reaper())
        return self._reaper

    def stopping(self) -> None:
        """The router is stopping: every runner is told at once (SIGTERM), so that it ends the answers in flight
        in their protocol's shape while the router still relays them; `close` then reaps them."""
        for s in (*self._slots.values(), *self._retired.values()):
            if s.runner is not None:
                s.runner.terminate()

    async def close(self) -> None:
        """Stop every runner (and the reaper); loads in flight are cancelled, which stops their processes."""
        if self._reaper is not None:
            self._reaper.cancel()
        for s in self._slots.values():
            if s.loading is not None:
                s.loading.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # stops under way finish: no process left
        slots = [*self._slots.values(), *self._retired.values()]
        await asyncio.gather(*(self._stop(s, UNLOADED, "router closing") for s in slots), return_exceptions=True)

    # -- reporting ----------------------------------------------------------------------------------------------

    def status(self) -> list[ModelStatus]:
        now, wall = time.monotonic(), time.time()
        return [s.report(now, wall) for s in self._slots.values()]

    def state(self, name: str) -> str:
        return self._slots[self.resolve(name)].state
