"""How many CPU threads each phase uses, chosen and re-chosen at run time: the single owner of that decision.

A desktop is never idle. One thread per core is fastest on a quiet machine, but when other programs want those
cores the threads of one decode wait for each other at every barrier and speed collapses
(docs/bench/threads.md#thread-numbers). So the thread count is measured, not configured, like the draft length.

`ThreadChooser` owns one phase (the target's verify rounds, the drafter's steps, prompt evaluation). It starts
from the calibrated step time per thread count (cached per model + machine + build), keeps the fastest, and
re-checks with *contemporaneous* comparisons: a probe round at a neighbouring count is compared with the median
of the rounds just before it at the current count, so a load change hits both sides alike. Probes come

- when the current count's recent step time moves away from its baseline by more than `change` (the machine
  got busier or quieter: noticed within a few rounds), and
- now and then (`probe_gap_s`, doubling while probes lose, back to the minimum after a switch), and
- when `CpuMeter` (machine.py) sees other programs start or stop using the cores (Linux: /proc/stat less this
  process's own CPU time). Step times alone can miss that: with 1 thread and two neighbours on 2 cores the
  scheduler often leaves the decoding thread a core of its own, so its speed hardly moves when they stop.

A probe that wins is probed once more before the count switches, so one lucky round does not move it.

`ThreadControl` holds the choosers of one engine, applies them with `Model.set_threads` between rounds, and
reports a `ThreadState` (counts in use, the changes with their reasons) that every front end reads.
`ThreadControl.pinned(n)` is `--threads N`: nothing is measured or changed.

OpenMP's wait policy is read once, when llama.cpp's runtime loads, so it cannot follow the thread count.
localspec leaves it at libgomp's default (docs/bench/threads.md#openmp): with the CPU meter moving a busy
machine to the free cores at once, the long default spin no longer costs anything there.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generator, Iterator, Mapping, Protocol, Sequence

from ..backend.machine import CpuMeter, cpu_count, free_cores
from .rate import v_at

if TYPE_CHECKING:
    from ..speculative.types import Step

PHASES = ("target", "draft", "prompt")
def candidates(cores: int) -> list[int]:
    """Thread counts calibration measures: 1, powers of two, and all cores (each ≤ cores)."""
    out, n = {1, cores}, 2
    while n < cores:
        out.add(n)
        n *= 2
    return sorted(out)


TIE = 0.05  # step times this close to the fastest are a tie


def preferred(times: Mapping[int, float]) -> int | None:
    """The count to start from: the most threads among those within TIE of the fastest. A near-tie is noise,
    and starting at fewer threads kept quiet runs there (docs/bench/threads.md#thread-numbers); a busy
    machine is the CPU meter's to notice, and it drops to the free cores at its first reading."""
    if not times:
        return None
    best = min(times.values())
    return max(n for n, t in times.items() if t <= best * (1 + TIE))


def neighbours(n: int, cores: int) -> list[int]:
    """Counts a probe tries from n: one less/more, half and double (hill-climbing on a many-core machine)."""
    return sorted({m for m in (n - 1, n + 1, n // 2, 2 * n) if 1 <= m <= cores and m != n})


def _plural(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class ThreadChange:
    """One switch of a phase's thread count, with the measurement that caused it."""

    at_s: float  # seconds since the controller started
    phase: str
    old: int
    new: int
    reason: str

    def to_dict(self) -> dict:
        return {"at_s": round(self.at_s, 3), "phase": self.phase, "old": self.old, "new": self.new,
                "reason": self.reason}


@dataclass(frozen=True)
class ThreadState:
    """A snapshot for stats, `run --json`, /metrics and the metrics log."""

    threads: int  # the target's verify rounds
    threads_batch: int  # prompt evaluation (llama.cpp's n_threads_batch)
    threads_draft: int | None  # the model drafter's steps; None without one
    pinned: bool
    changes: tuple[ThreadChange, ...] = ()
    step_ms: dict[str, dict[int, float]] = field(default_factory=dict)  # phase -> threads -> latest ms per row

    @property
    def reason(self) -> str | None:
        """Why the latest change happened (None while the calibrated choice holds)."""
        return self.changes[-1].reason if self.changes else None

    def line(self) -> str:
        """Short text for a stats line: 'threads 1 (batch 2, draft 1)'."""
        extra = [f"batch {self.threads_batch}"] + ([f"draft {self.threads_draft}"] if self.threads_draft else [])
        return f"threads {self.threads} ({', '.join(extra)}{', pinned' if self.pinned else ''})"

    def to_dict(self) -> dict:
        return {"threads": self.threads, "threads_batch": self.threads_batch, "threads_draft": self.threads_draft,
                "pinned": self.pinned, "changes": [c.to_dict() for c in self.changes],
                "step_ms": {p: {str(n): round(ms, 4) for n, ms in d.items()} for p, d in self.step_ms.items()}}


class ThreadChooser:
    """The thread count of one phase; see the module docstring. `observe` takes seconds per unit of work
    (one row, one drafted token, one prompt token) so rounds of different sizes compare."""

    def __init__(self, phase: str, cores: int, *, prior: Mapping[int, float] | None = None, start: int | None = None,
                 clock: Callable[[], float] = time.monotonic, window: int = 3, change: float = 1.3,
                 margin: float = 0.08, probe_gap_s: tuple[float, float] = (0.5, 8.0)) -> None:
        self.phase, self.cores, self.clock = phase, max(1, cores), clock
        self.est: dict[int, float] = {n: t for n, t in (prior or {}).items() if 1 <= n <= self.cores}
        self.current = start or preferred(self.est) or self.cores
        self.window, self.change, self.margin = window, change, margin
        self.gap_min, self.gap_max = probe_gap_s
        self.gap = self.gap_min
        self.recent: deque[float] = deque(maxlen=window)
        self.baseline = self.est.get(self.current)  # what the current count "normally" takes
        self.t0 = clock()
        self.next_probe = self.t0 + self.gap
        self.queue: list[int] = []
        self.probing: int | None = None
        self.won: tuple[int, float] | None = None  # a probe that won once: (count, seconds), confirmed next round
        self.changes: list[ThreadChange] = []
        self.ceiling: int | None = None  # no probe above this many (the free cores while the machine is busy)
        self.quiet = False  # the CPU meter says no other program is using the cores

    def choose(self) -> int:
        """The count for the next round: the current one, or a probe when one is due."""
        if self.probing is None and self.cores > 1 and len(self.recent) >= min(2, self.window):
            if not self.queue and self.clock() >= self.next_probe:
                self.queue = neighbours(self.current, self.cores)
            if self.queue and self.ceiling is not None:
                self.queue = [m for m in self.queue if m <= self.ceiling]
            if self.queue:
                self.probing = self.queue.pop(0)
        return self.probing if self.probing is not None else self.current

    def observe(self, n: int, seconds: float) -> None:
        """Seconds per unit of work of a round run with n threads."""
        if seconds <= 0:
            return
        self.est[n] = seconds
        if n == self.probing:
            self.probing = None
            self._judge(n, seconds)
        elif n == self.current:
            self.recent.append(seconds)
            self._watch()

    def _now_median(self) -> float:
        return sorted(self.recent)[len(self.recent) // 2]  # the upper median: every round, so no statistics

    def _watch(self) -> None:
        """Notice a load change: the recent median left the baseline by more than `change` either way."""
        if len(self.recent) < self.window:
            return
        med = self._now_median()
        if self.baseline is None:
            self.baseline = med
            return
        ratio = med / self.baseline
        if ratio > self.change or ratio < 1 / self.change:
            self.baseline = med
            self.next_probe = min(self.next_probe, self.clock())  # probe now: maybe another count wins
        else:
            self.baseline = 0.9 * self.baseline + 0.1 * med

    def _judge(self, n: int, seconds: float) -> None:
        """Compare a probe with the rounds just before it at the current count; switch if clearly faster twice
        in a row (one lucky round on a noisy machine does not move the count)."""
        now = self._now_median() if self.recent else float("inf")
        # the meter says nothing else runs: fewer threads winning is then more likely noise than a busy machine,
        # and more threads are what a quiet machine is expected to want (a half margin: the gain may be ~10 %)
        margin = self.margin if not self.quiet else 3 * self.margin if n < self.current else self.margin / 2
        won = seconds < now * (1 - margin)
        first = self.won if won and self.won is not None and self.won[0] == n else None  # this win confirms it
        if won and first is None:
            self.won = (n, seconds)
            self.queue.insert(0, n)  # confirm: probe it again next round
            return
        if first is not None:
            self._switch(n, now, max(seconds, first[1]))  # the slower of the two probes
        elif not self.queue:
            self.gap = min(2 * self.gap, self.gap_max)  # every neighbour lost: probe less often
        self.won = None
        self.next_probe = self.clock() + self.gap

    def _switch(self, n: int, now: float, seconds: float) -> None:
        why = "machine busy" if n < self.current else "machine quiet"
        verb = "is" if n == 1 else "are"
        self.move(n, f"{why}: {_plural(n)} {verb} {now / seconds:.1f}× faster than {self.current}")
        self.baseline = seconds

    def nudge(self) -> None:
        """Someone else's evidence that the machine changed (the CPU meter): probe at the next round."""
        self.next_probe = min(self.next_probe, self.clock())
        self.gap = self.gap_min

    def move(self, n: int, reason: str) -> None:
        """Switch to n threads (a won comparison, or another phase's evidence of a load change)."""
        old = self.current
        self.changes.append(ThreadChange(self.clock() - self.t0, self.phase, old, n, reason))
        self.current, self.baseline, self.won = n, None, None
        self.recent.clear()
        self.queue = [m for m in neighbours(n, self.cores) if m != old]  # keep climbing that way
        self.gap = self.gap_min


def verify_rows_cost(v: Sequence[float], d: int) -> float:
    """v(d): a verify pass of d+1 rows in single-row units, from calibration (the γ controller's rule past the
    measured points, or without any)."""
    return max(v_at(v, d), 1e-9)


class ThreadModel(Protocol):
    """What ThreadControl needs from a model (backend.Model has it)."""

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None: ...


class ThreadControl:
    """The thread choosers of one engine (target, drafter, prompt), applied between rounds, and the CPU meter
    that tells them when the machine turns busy (drop to the free cores, probe no higher) or quiet (probe).

    `follow(steps)` wraps the loop's generator: `before_prefill()` before it starts, then after each round
    `observe(step)` and `before_round()` (the generator is suspended between rounds, so the counts change exactly
    there). A verify pass of γ+1 rows costs v(γ) single rows (`v`, from calibration), so rounds of any γ compare
    per row."""

    BUSY_AT, QUIET_AT = 0.5, 0.2  # cores used by others: busy at or above, quiet at or below (in between: as was)
    GAPS_S, METERED_GAPS_S = (0.5, 8.0), (2.0, 30.0)  # periodic probes: first gap, longest gap

    def __init__(self, target: ThreadModel, draft: ThreadModel | None = None, *, cores: int | None = None,
                 prior: Mapping[str, Mapping[int, float]] | None = None, v: Sequence[float] = (),
                 pinned: int | None = None, clock: Callable[[], float] = time.monotonic,
                 meter: CpuMeter | None = None) -> None:
        self.target, self.draft = target, draft
        self.meter = meter  # None: step times only (the loader gives a real engine a CpuMeter)
        self.busy: bool | None = None  # what the meter last said
        self.cores = cores or cpu_count()
        self.pinned_n = pinned
        self.v = tuple(v)
        prior = prior or {}
        phases = PHASES if draft is not None else ("target", "prompt")
        # with a meter to say when the machine changes, periodic probes are only a backstop: each one at a
        # losing count costs a slow round (6x a normal one with two neighbours on 2 cores)
        gaps = self.METERED_GAPS_S if meter is not None else self.GAPS_S
        self.choosers = {p: ThreadChooser(p, self.cores, prior=prior.get(p), start=pinned, clock=clock,
                                          probe_gap_s=gaps) for p in phases}
        self._round: dict[str, int] = {}
        self._heard: float | None = None  # the meter reading last acted on

    @classmethod
    def pinned(cls, target: ThreadModel, draft: ThreadModel | None, n: int) -> "ThreadControl":
        """`--threads N`: every phase uses N, nothing is measured or switched."""
        return cls(target, draft, pinned=n)

    @staticmethod
    def _set(model: ThreadModel | None, n: int, n_batch: int) -> None:
        """Every round (two ints in the context: cheap), so engines sharing a model never see another's count."""
        if model is not None:
            model.set_threads(n, n_batch)

    def _pick(self, phase: str) -> int:
        if self.pinned_n is not None:
            return self.pinned_n
        return self.choosers[phase].choose()

    def follow(self, steps: Iterator["Step"]) -> Generator["Step", None, None]:
        """The loop's steps with the thread counts applied around them. The first round runs at the prompt's
        count (prefill and that round are one resumption of the loop), so it only informs the prompt phase."""
        try:
            self.before_prefill()
            first = True
            for step in steps:
                self.observe(step, prompt_only=first)
                first = False
                yield step
                self.before_round()
        finally:
            close = getattr(steps, "close", None)
            if close:
                close()

    def before_prefill(self) -> None:
        self._listen()
        n = self._round["prompt"] = self._pick("prompt")
        self._set(self.target, n, n)
        if self.draft is not None:  # a model drafter catches up on the prompt during the first round
            d = self._round["draft"] = self._pick("draft")
            self._set(self.draft, d, d)

    def before_round(self) -> None:
        """Counts for this round. A verify pass of γ+1 > 1 rows runs on n_threads_batch, one row on
        n_threads: both get the round's count (prompt evaluation sets its own before the next prefill)."""
        self._listen()
        n = self._round["target"] = self._pick("target")
        self._set(self.target, n, n)
        if self.draft is not None:
            d = self._round["draft"] = self._pick("draft")
            self._set(self.draft, d, d)

    def _listen(self) -> None:
        """When the meter sees the machine turn busy, a phase using more threads than there are free cores
        drops to that many at once (every round at the old count would wait on a preempted thread); when it
        turns quiet, every phase probes. Measurements have the last word: the probes that follow compare the
        counts on this machine as it is."""
        others = self.meter.others() if self.meter is not None and self.pinned_n is None else None
        if others is None or others == self._heard:
            return  # no new reading since the last round (the meter reads every 0.1 s)
        self._heard = others
        busy = True if others >= self.BUSY_AT else False if others <= self.QUIET_AT else self.busy
        if busy != self.busy and busy is not None:  # a change, or the first reading
            first = self.busy is None
            free = free_cores(self.cores, others)
            for c in self.choosers.values():
                if busy and c.current > free:
                    c.move(free, f"machine busy: other programs use {others:.1f} of {self.cores} cores")
                elif busy or not first or c.current < self.cores:
                    # quiet at the first reading: a count below the cores came from a prior measured on a
                    # busier machine (a calibration cached while a build ran), so find out now
                    c.nudge()
        if busy is not None:
            # while busy, no probe above the free cores: such a round waits at every barrier for a thread the
            # scheduler preempted (a 2-thread probe among two hogs on 2 cores cost several 1-thread rounds),
            # and on so noisy a machine a lucky probe could win
            ceiling = free_cores(self.cores, others) if busy else None
            for c in self.choosers.values():
                c.ceiling, c.quiet = ceiling, not busy
        self.busy = busy

    def observe(self, step: "Step", *, prompt_only: bool = False) -> None:
        if self.pinned_n is not None:
            return
        if step.n_prompt > 8 and step.t_prompt > 0 and step.t_verify > 0:  # a prompt long enough to time per token,
            # in a pass of its own (a short tail shares the first verify pass: speculative/loop.py's MERGE_MAX)
            self._feed("prompt", step.t_prompt / (step.n_prompt - 1))
        if prompt_only:
            return
        target = self.choosers["target"]
        seen = len(target.changes)
        rows = verify_rows_cost(self.v, step.drafted) if step.drafted else 1.0
        self._feed("target", step.t_verify / rows)
        if len(target.changes) > seen:
            self._prompt_follows(target.changes[-1])
        if step.drafted and step.source == "model":
            self._feed("draft", step.t_draft / step.drafted)

    def _prompt_follows(self, change: ThreadChange) -> None:
        """Prompt evaluation learns once per request, too slowly for a load change the target's rounds show
        within a second: when the machine gets busier it uses no more threads than the target, when quieter
        no fewer."""
        prompt = self.choosers["prompt"]
        busier = change.new < change.old
        if (busier and prompt.current > change.new) or (not busier and prompt.current < change.new):
            prompt.move(change.new, f"follows the target ({change.reason})")

    def _feed(self, phase: str, seconds: float) -> None:
        if phase in self.choosers and phase in self._round:
            self.choosers[phase].observe(self._round[phase], seconds)

    def state(self) -> ThreadState:
        ch = self.choosers
        cur = {p: (self.pinned_n or c.current) for p, c in ch.items()}
        changes = sorted((x for c in ch.values() for x in c.changes), key=lambda x: x.at_s)
        return ThreadState(cur["target"], cur["prompt"], cur.get("draft"), self.pinned_n is not None,
                           tuple(changes), {p: {n: 1e3 * t for n, t in sorted(c.est.items())} for p, c in ch.items()})
