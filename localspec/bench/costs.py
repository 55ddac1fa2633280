"""Measured cost ratios for the speedup formula: c (drafter step ÷ target step) and v(γ) (target time for
γ+1 tokens ÷ time for 1), on this machine, at a realistic context position.

Each timing is one `decode` appended at the same position and rewound afterwards, so every repeat sees the same
cache; repeats are interleaved across batch sizes and the minimum is kept. Prompt lookup's c is measured too (one `propose` ÷ γ): tiny, not zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..backend import Model
from ..drafters import PromptLookup, common_prefix
from ..sampling import SamplingParams


@dataclass(frozen=True)
class Costs:
    t_target_ms: float  # one target token at the measured position
    t_verify_ms: dict[int, float]  # γ -> target time for γ+1 tokens
    c: dict[str, float] = field(default_factory=dict)  # drafter name -> drafter step ÷ target step
    position: int = 0

    @property
    def v(self) -> dict[int, float]:
        return {g: t / self.t_target_ms for g, t in self.t_verify_ms.items()}

    def to_dict(self) -> dict:
        return {"position": self.position, "t_target_ms": self.t_target_ms,
                "t_verify_ms": {str(g): t for g, t in self.t_verify_ms.items()},
                "v": {str(g): x for g, x in self.v.items()}, "c": dict(self.c)}


def _prefill(model: Model, prefix: Sequence[int]) -> int:
    keep = common_prefix(model.tokens, prefix)
    model.rewind(keep)
    if prefix[keep:]:
        model.decode(list(prefix[keep:]), 0)
    return model.n_past


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def decode_ms(model: Model, prefix: Sequence[int], batch: Sequence[int]) -> float:
    """ms to decode `batch` (logits for every row, as verify asks) after `prefix`; the cache is left at prefix."""
    base = _prefill(model, prefix)
    try:
        return _timed(lambda: model.decode(list(batch), len(batch)))
    finally:
        model.rewind(base)


def measure(target: Model, context: Sequence[int], gammas: Sequence[int], *,
            drafters: dict[str, Model] | None = None, lookup: bool = False, repeats: int = 7) -> Costs:
    """Costs at one position (len(context) - max(γ) - 1). Repeats are interleaved across γ so drift hits all
    alike, and each timing keeps its minimum: on a shared machine noise only ever adds time."""
    g_max = max(gammas)
    if len(context) < g_max + 2:
        raise ValueError(f"cost context needs at least {g_max + 2} tokens, got {len(context)}")
    ctx = list(context)
    pos = len(ctx) - g_max - 1
    prefix, follow = ctx[:pos], ctx[pos:]
    sizes = sorted({1} | {g + 1 for g in gammas})
    best: dict[str, float] = {}

    def keep(key: str, ms: float) -> None:
        best[key] = min(ms, best.get(key, float("inf")))

    drafters = drafters or {}
    params, rng, lk = SamplingParams(), np.random.default_rng(0), PromptLookup()
    for rep in range(repeats + 1):  # repeat 0 is a warm-up (first calls allocate compute buffers)
        for n in sizes:
            ms = decode_ms(target, prefix, follow[:n])
            if rep:
                keep(f"t{n}", ms)
        for name, m in drafters.items():
            ms = decode_ms(m, prefix, follow[:1])
            if rep:
                keep(name, ms)
        if lookup:
            ms = _timed(lambda: lk.propose(ctx[:pos + 1], lambda source: g_max, params, rng))
            if rep:
                keep("lookup", ms / g_max)
    t1 = best["t1"]
    c = {name: best[name] / t1 for name in drafters}
    if lookup:
        c["lookup"] = best["lookup"] / t1
    return Costs(t1, {g: best[f"t{g + 1}"] for g in sorted(set(gammas))}, c, pos)


def merge(a: Costs, b: Costs) -> Costs:
    """Average two measurements (taken at the start and the end of a run, to cancel drift)."""
    avg = lambda x, y: (x + y) / 2  # noqa: E731
    return Costs(avg(a.t_target_ms, b.t_target_ms),
                 {g: avg(a.t_verify_ms[g], b.t_verify_ms[g]) for g in a.t_verify_ms},
                 {k: avg(a.c[k], b.c[k]) for k in a.c}, a.position)
