"""The closed form the controllers decide with (Leviathan et al. 2023, §3.4, per-position form), apart from
who decides: the γ controller (controller.py) picks the draft length with it, the thread controller
(threads.py) turns a verify round's time into time per row with `v_at`, and the bench's predictions
(bench/theory.py) use its E(γ) with one α for every position.

    E(γ) = 1 + Σ_{i=1..γ} Π_{j≤i} α_j          tokens per round (accepted drafts + the target's own)
    T(γ) = γ·c + v(γ)                          round cost in target single-token steps
    rate(γ) = E(γ) / T(γ)                      plain decoding: rate(0) = 1 / v(0) = 1
"""

from __future__ import annotations

from typing import Sequence


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E(γ=k) = 1 + Σ_{i≤k} Π_{j≤i} α_j; α beyond the given positions repeats the last one."""
    e, run = 1.0, 1.0
    for i in range(k):
        run *= alphas[min(i, len(alphas) - 1)] if alphas else 0.0
        e += run
    return e


def round_rate(alphas: Sequence[float], c: float, v: Sequence[float], k: int) -> float:
    """Tokens per target single-token time for draft length k (plain decoding: k = 0 -> 1 / v(0))."""
    return expected_tokens(alphas, k) / (k * c + v_at(v, k))


def best_k(alphas: Sequence[float], c: float, v: Sequence[float], k_min: int, k_max: int,
           allowed: frozenset[int] | None = None) -> tuple[int, float]:
    """(γ, rate) maximising rate(γ) over k_min..k_max, or over the `allowed` lengths in it (ties go to the
    shorter draft). One pass: E(γ) is accumulated, so a long range (lookup drafts up to 32) costs O(k_max), not
    O(k_max²), per decision."""
    if not 1 <= k_min <= k_max:
        raise ValueError(f"need 1 <= k_min <= k_max, got {k_min}..{k_max}")
    best = (k_min, -1.0)
    e, run = 1.0, 1.0
    for k in range(1, k_max + 1):
        run *= alphas[min(k - 1, len(alphas) - 1)] if alphas else 0.0
        e += run
        if k >= k_min and (allowed is None or k in allowed):
            r = e / (k * c + v_at(v, k))
            if r > best[1] + 1e-12:
                best = (k, r)
    return best


ROW_GUESS = 0.45  # v with nothing measured: each extra verify row guessed at 0.45 of a step, as on a quiet CPU


def v_at(v: Sequence[float], k: int) -> float:
    """v(k): the measured value, else extrapolated linearly past the last measured point with the slope of the
    upper half of the measured range. v(0) → v(1) carries the fixed cost of a batch, and batch kernels get
    cheaper per row as batches grow (docs/bench/calibration.md#v-past-timed), so the far end predicts the rows
    beyond best."""
    if k < len(v):
        return v[k]
    if len(v) >= 3:
        lo = max(1, len(v) // 2)
        return v[-1] + (k - len(v) + 1) * max((v[-1] - v[lo]) / (len(v) - 1 - lo), 0.0)
    if len(v) == 2:
        return v[-1] + (k - 1) * max(v[-1] - v[0], 0.0)
    return 1.0 + ROW_GUESS * k
