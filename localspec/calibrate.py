"""Measure, at load, what a verify round costs on this machine: v(γ) and the drafter's cost c.

Speculation pays only while scoring γ+1 positions costs little more than one (idle compute). That is a
property of the model, the quantization and the hardware, so it is measured, not looked up: a few short
decodes at the end of the cache, each rewound, the reps interleaved so a noisy neighbour hits every γ alike.
The caches are left exactly as they were found.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .backend import Model

_PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the calibration loop times a few decodes."


@dataclass(frozen=True)
class Calibration:
    t1: float  # seconds for one target row (decode one token + argmax)
    v: tuple[float, ...]  # v[γ] = time for γ+1 rows ÷ t1, γ = 0..k_max (v[0] = 1)
    c_model: float | None = None  # drafter single-token step ÷ target single-token step

    def to_dict(self) -> dict:
        return {"t1_ms": 1e3 * self.t1, "v": list(self.v), "c_model": self.c_model}


def _probe_tokens(model: Model, n: int) -> list[int]:
    toks = model.tokenize(_PROBE_TEXT, add_special=False) or [0]
    return (toks * (n // len(toks) + 1))[:n]


def _time_rows(model: Model, prefix: list[int], n: int) -> float:
    """Seconds to decode n tokens after `prefix` with logits for all n rows (a verify pass), then rewind."""
    base = model.n_past
    t0 = time.perf_counter()
    logits = model.decode(prefix[:n], n)
    logits.argmax(axis=-1)
    dt = time.perf_counter() - t0
    model.rewind(base)
    return dt


def measure_rows(model: Model, k_max: int, *, reps: int = 3, context: int = 16, budget_s: float = 2.0,
                 warm: bool = True) -> list[float]:
    """Seconds for 1..k_max+1 verify rows after `context` tokens: the minimum over reps (interference from
    other processes only ever adds time). Stops early, after at least one rep, once `budget_s` is spent."""
    start = model.n_past
    room = model.n_ctx - start - context
    k_max = max(0, min(k_max, room - 1))
    toks = _probe_tokens(model, context + k_max + 1)
    try:
        if context:
            model.decode(toks[:context], 0)
        rows = toks[context:]
        for n in (1, k_max + 1, 1) if warm else ():  # warm-up: page in the weights, allocate buffers
            _time_rows(model, rows, n)
        times: list[list[float]] = [[] for _ in range(k_max + 1)]
        t_end = time.perf_counter() + budget_s
        for r in range(reps):
            for g in range(k_max + 1):
                times[g].append(_time_rows(model, rows, g + 1))
            if r >= 1 and time.perf_counter() > t_end:
                break
        return [min(t) for t in times]
    finally:
        model.rewind(start)


def calibrate(target: Model, *, k_max: int = 8, draft_model: Model | None = None, reps: int = 3) -> Calibration:
    """v(0..k_max) for the target and, when a drafter model is given, its cost c per drafted token.
    v is made non-decreasing (more rows never cost less; a dip is noise)."""
    rows = measure_rows(target, k_max, reps=1)
    d1 = measure_rows(draft_model, 0, reps=1)[0] if draft_model is not None else None
    for _ in range(reps - 1):  # interleaved, so target and drafter are timed under the same machine load
        rows = [min(a, b) for a, b in zip(rows, measure_rows(target, k_max, reps=1, warm=False))]
        if draft_model is not None:
            d1 = min(d1, measure_rows(draft_model, 0, reps=1, warm=False)[0])
    t1 = rows[0]
    v = [1.0]
    for t in rows[1:]:
        v.append(max(t / t1, v[-1]))
    c = d1 / t1 if d1 is not None else None
    return Calibration(t1, tuple(v), c)
