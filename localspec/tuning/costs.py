"""Measure what decoding costs on this machine: the one place costs are measured (calibration, controller, bench).

- v(γ): target time for γ+1 verify rows ÷ time for one row, as the loop meets them (`timed_round`: a verify
  pass among plain rounds costs its own compute graph and the next plain round's); not monotone, the kernels
  work in tiles of rows (`timed_gammas`). Speculation pays only while scoring γ+1 positions costs little more
  than one (idle compute): a property of the model, quantization and hardware, so measured.
- c: a drafter's step ÷ the target's step (per drafted token; prompt lookup's is tiny, not zero).
- step time per thread count, per phase (a verify row, a drafter step, a prompt token): the prior of the thread
  controller (localspec/tuning/threads.py).

Every timing appends a few tokens at the end of the cache and rewinds them, so the caches are left exactly as they
were found (a recurrent state through a checkpoint taken first: backend/rollback.py). Repeats are interleaved across
the things compared (thread counts, models) so a noisy neighbour hits all alike, and each keeps its minimum: on a
shared machine noise only ever adds time. v(γ) is a ratio, so it is timed as one: each verify round against the
plain rounds beside it (`_verify_ratios`). A `Deadline` stops any measurement early, after at least one timed
repeat; a hard one abandons a measurement (`OutOfTime`) that cannot finish that repeat in time, so a budget is
overrun by at most one decode. """

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Mapping, Sequence, TypeGuard

import numpy as np

from ..backend import Model
from ..sampling.params import SamplingParams
from ..speculative.drafters import PromptLookup

PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the calibration loop times a few decodes."


@dataclass(frozen=True)
class Costs:
    """Measured cost ratios at one cache position."""

    t1: float  # seconds for one target row
    v: tuple[float, ...]  # v[γ] = time for γ+1 rows ÷ t1, γ = 0..k_max; v[0] = 1 (not monotone: see timed_gammas)
    c: dict[str, float] = field(default_factory=dict)  # drafter (or source) name -> its step ÷ target step
    position: int = 0
    timed: tuple[int, ...] = ()  # the γ ≥ 1 actually timed (the rest is interpolated); () = every γ

    @property
    def t_target_ms(self) -> float:
        return 1e3 * self.t1

    @property
    def v_by_gamma(self) -> dict[int, float]:
        """{γ: v(γ)} for γ ≥ 1 (the bench's tables)."""
        return {g: x for g, x in enumerate(self.v) if g >= 1}

    def to_dict(self) -> dict:
        return {"position": self.position, "t_target_ms": self.t_target_ms,
                "t_verify_ms": {str(g): self.t_target_ms * x for g, x in self.v_by_gamma.items()},
                "v": {str(g): x for g, x in self.v_by_gamma.items()}, "c": dict(self.c), "timed": list(self.timed)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Costs":
        v = [1.0] + [float(x) for _, x in sorted((int(g), x) for g, x in d["v"].items())]
        return cls(d["t_target_ms"] / 1e3, tuple(v), {k: float(x) for k, x in d["c"].items()}, d.get("position", 0),
                   tuple(int(g) for g in d.get("timed", ())))


def at_least_one(ratios: Sequence[float]) -> tuple[float, ...]:
    """v with v(0) = 1 and no γ cheaper than one row. Not made monotone: a batch whose rows fill the CPU kernels'
    tiles costs less than one row fewer (timed_gammas), and that dip is what the controller should find."""
    return (1.0, *(max(1.0, x) for x in ratios[1:]))


def merge(a: Costs, b: Costs) -> Costs:
    """Average two measurements (the bench takes one at the start and one at the end of a run, to cancel drift)."""
    avg = lambda x, y: (x + y) / 2  # noqa: E731
    return Costs(avg(a.t1, b.t1), at_least_one([avg(x, y) for x, y in zip(a.v, b.v)]),
                 {k: avg(a.c[k], b.c.get(k, a.c[k])) for k in a.c}, a.position, a.timed)


def probe_tokens(model: Model, n: int) -> list[int]:
    """n tokens of ordinary text (repeated as needed) to time decodes with."""
    toks = model.tokenize(PROBE_TEXT, add_special=False) or [0]
    return (toks * (n // len(toks) + 1))[:n]


def timed_decode(model: Model, tokens: Sequence[int], rows: int) -> float:
    """Seconds to decode `tokens` with logits for the last `rows` rows, then rewind them."""
    base = model.n_past
    model.checkpoint("measure")  # a recurrent state comes back to here (rollback.py); untimed
    t0 = time.perf_counter()
    try:
        model.decode(list(tokens), rows)
        return time.perf_counter() - t0
    finally:
        model.rewind(base)


def timed_round(model: Model, tokens: Sequence[int]) -> float:
    """Seconds of a verify round of len(tokens) rows as the loop runs it among plain rounds, and of the plain
    round after it. llama.cpp keeps the compute graph of the last decode and reuses it for a batch of the same
    shape, so a one-row decode after a one-row decode skips building its graph (docs/bench/calibration.md#timed-round),
    while a verify round builds its own and makes the next plain round build one again. One row (γ = 0) is a
    plain round. Every call ends on a one-row decode, so in a sequence of them (`measure`'s interleaved timers)
    each starts from a one-row graph, as a round of the loop does. Everything is rewound. On a recurrent or
    hybrid model the time includes a checkpoint and its restore, as a verify round pays them (rollback.py)."""
    base = model.n_past
    t0 = time.perf_counter()
    try:
        model.checkpoint("measure")
        if len(tokens) > 1:
            model.decode(list(tokens), len(tokens))
            model.rewind(base)
        model.decode(list(tokens[:1]), 1)
        return time.perf_counter() - t0
    finally:
        model.rewind(base)


@dataclass(frozen=True)
class Deadline:
    at: float  # time.perf_counter() value
    hard: bool = False  # past it before one timed repeat of everything: raise OutOfTime


class OutOfTime(Exception):
    """A hard deadline passed before the measurement had one timed repeat; its partial results are dropped."""


def _out_of_time(deadline: Deadline | None) -> TypeGuard[Deadline]:  # True: there is a deadline, and it passed
    return deadline is not None and time.perf_counter() > deadline.at


def _interleaved(timers: Mapping[str, Callable[[], float]], repeats: int,
                 deadline: Deadline | None) -> dict[str, float]:
    """Minimum of each timer over `repeats` interleaved rounds after a warm-up call of each (first calls start
    the thread pool and allocate compute buffers); stops at the deadline once every timer has been timed."""
    best: dict[str, float] = {}
    for fn in timers.values():
        fn()
    for _ in range(repeats):
        for key, fn in timers.items():
            if _out_of_time(deadline):
                if len(best) == len(timers):
                    return best
                if deadline.hard:
                    raise OutOfTime()
            best[key] = min(fn(), best.get(key, float("inf")))
    return best


DENSE_TO = 8  # v(γ) is timed at every γ up to here, then where γ + 1 fills a tile of TILE rows, and at k_max
TILE = 4
COARSE_FROM, COARSE_TILE = 32, 16  # past 32 rows, only where γ + 1 fills a tile of 16: two more timed rounds to 64


def timed_gammas(k_max: int) -> list[int]:
    """The γ whose verify pass `measure` times. Past DENSE_TO only those whose γ + 1 rows are a multiple of TILE,
    and k_max: llama.cpp's CPU matrix kernels take rows in tiles of 4, and a batch that fills its last tile costs
    less than one row fewer. The controller drafts only timed lengths (`Costs.timed`), so it lands on those dips and
    never on an interpolated γ; long drafts need v measured where they are, not extrapolated. Past 32 rows (a copy
    that has run on, a loop) coarser, every 16: such rounds are dear to time
    (docs/bench/calibration.md#timed-gammas)."""
    dense = set(range(min(k_max, DENSE_TO) + 1))
    tiles = {g for g in range(DENSE_TO + 1, k_max + 1)
             if (g + 1) % (TILE if g < COARSE_FROM else COARSE_TILE) == 0}
    return sorted(dense | tiles | {k_max})


def interpolate(points: Mapping[int, float], k_max: int) -> list[float]:
    """v at every γ in 0..k_max, linear between the timed ones."""
    xs = sorted(points)
    return [float(x) for x in np.interp(range(k_max + 1), xs, [points[x] for x in xs])]


def measure(target: Model, context: Sequence[int], k_max: int, *, drafters: Mapping[str, Model] | None = None,
            lookup: bool = False, repeats: int = 3, deadline: Deadline | None = None) -> Costs:
    """v(0..k_max) and c at the end of `context` (appended after what the caches hold; everything rewound);
    v is timed at `timed_gammas(k_max)` and interpolated between. `drafters` maps a name (a source like "model",
    or a bench label) to its model; `lookup` adds prompt lookup's c."""
    drafters = dict(drafters or {})
    room = target.n_ctx - target.n_past - 1
    k_max = max(0, min(k_max, room - 2))
    ctx = list(context) or [0]
    while len(ctx) < k_max + 2:
        ctx += ctx
    pos = len(ctx) - k_max - 1
    prefix, follow = ctx[:pos], ctx[pos:]
    models = [target, *drafters.values()]
    bases = [m.n_past for m in models]
    try:
        if deadline is not None and deadline.hard and _out_of_time(deadline):
            raise OutOfTime()  # before the prefill, which is most of a stage on a busy machine
        for m in models:
            if prefix:
                m.decode(prefix, 0)
        gammas = timed_gammas(k_max)
        timers: dict[str, Callable[[], float]] = {
            f"d:{name}": partial(timed_decode, m, follow[:1], 1) for name, m in drafters.items()}
        if lookup and k_max:
            timers["lookup"] = _lookup_timer(ctx[:pos + 1], k_max)
        # warm-up: the pool and the largest batch's buffers (not every batch: on a 270M model that alone is ~1 s)
        timed_round(target, follow[:1])
        timed_round(target, follow[:gammas[-1] + 1])
        t1, ratio = _verify_ratios(target, follow, [g for g in gammas if g], repeats, deadline)
        best = _interleaved(timers, repeats, deadline) if timers else {}
    finally:
        for m, b in zip(models, bases):
            m.rewind(b)
    c = {name: best[f"d:{name}"] / t1 for name in drafters}
    if "lookup" in best:
        c["lookup"] = best["lookup"] / t1
    v = interpolate({0: 1.0} | {g: r - 1 for g, r in ratio.items()}, k_max)
    return Costs(t1, at_least_one(v), c, bases[0] + pos, tuple(g for g in gammas if g))


def _verify_ratios(target: Model, follow: Sequence[int], gammas: Sequence[int], repeats: int,
                   deadline: Deadline | None) -> tuple[float, dict[int, float]]:
    """t1 (the fastest plain round) and, per γ, the smallest over `repeats` of a verify round's time (`timed_round`:
    with the plain round after it) over the faster of the plain rounds timed just before and just after it. The
    machine's speed drifts over seconds: a minimum of t1 and one of each t(γ), taken a second apart, divide one
    moment by another, while a round and the plain rounds beside it see one moment. The smallest, because a stall
    lands in one round and inflates its ratio (docs/bench/calibration.md#v-ratio). Stops at the deadline once every γ
    has a ratio; a hard one raises `OutOfTime` before that."""
    ratios: dict[int, list[float]] = {g: [] for g in gammas}
    t1 = before = timed_round(target, follow[:1])
    for _ in range(repeats):
        for g in gammas:
            if _out_of_time(deadline):
                if all(ratios.values()):
                    return t1, {g: min(r) for g, r in ratios.items()}
                if deadline.hard:
                    raise OutOfTime()
            t = timed_round(target, follow[:g + 1])
            after = timed_round(target, follow[:1])
            ratios[g].append(t / min(before, after))
            t1, before = min(t1, after), after
    return t1, {g: min(r) for g, r in ratios.items()}


def _lookup_timer(context: list[int], k: int) -> Callable[[], float]:
    """Seconds per drafted token of one prompt-lookup proposal."""
    lk, params, rng = PromptLookup(), SamplingParams(), np.random.default_rng(0)

    def fn() -> float:
        t0 = time.perf_counter()
        lk.propose(context, lambda source: k, params, rng)
        return (time.perf_counter() - t0) / k

    return fn


def thread_times(model: Model, counts: Sequence[int], tokens: Sequence[int], *, rows: int = 1, repeats: int = 3,
                 deadline: Deadline | None = None) -> dict[int, float]:
    """Seconds per token to decode `tokens` (logits for `rows` rows) at each thread count, interleaved so every
    count sees the same machine load. The model's thread counts are restored afterwards."""
    before = model.threads

    def at(n: int) -> Callable[[], float]:
        def fn() -> float:
            model.set_threads(n, n)
            return timed_decode(model, tokens, rows) / len(tokens)
        return fn

    try:
        best = _interleaved({str(n): at(n) for n in counts}, repeats, deadline)
    finally:
        model.set_threads(*before)
    return {int(n): s for n, s in best.items()}


def flash_attn_times(model: Model, tokens: Sequence[int], *, repeats: int = 3,
                     deadline: Deadline | None = None) -> dict[bool, float]:
    """Seconds for one row after `tokens` with flash attention on and off (each setting rebuilds the context,
    so the cache must be empty). The model is left with the faster setting (as found if out of time)."""
    if model.n_past:
        raise ValueError("flash_attn_times needs an empty cache (it rebuilds the context)")
    found = model.options.flash_attn
    out: dict[bool, float] = {}
    for on in (True, False, True, False):  # twice each, alternating: a drift in load hits both alike
        try:
            model.set_flash_attn(on)
            try:
                model.decode(list(tokens[:-1]), 0)
                timer = {"t": lambda: timed_decode(model, tokens[-1:], 1)}
                out[on] = min(out.get(on, float("inf")), *_interleaved(timer, repeats, deadline).values())
            finally:
                model.rewind(0)
        except OutOfTime:
            if len(out) == 2:  # one pass of each is an answer
                break
            model.set_flash_attn(found)
            raise
    model.set_flash_attn(min(out, key=out.__getitem__))
    return out


def with_c(costs: Costs, c: Mapping[str, float]) -> Costs:
    """The same costs with c re-keyed (a bench label -> the source name `Step.source` reports)."""
    return replace(costs, c=dict(c))
