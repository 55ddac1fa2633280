"""Sampling parameters and the warp from logits to the final sampling distribution.

`warp` is applied identically to the target's rows (p) and the drafter's rows (q): that is what makes the
verify rule's p and q comparable. Temperature 0 means greedy; the greedy path never builds probabilities.

Order of warps (llama.cpp's default chain order): top-k, top-p, min-p on the temperature-scaled softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Top-p first looks inside the best `_NUCLEUS_PROBE` tokens; when they already hold top_p of the mass the
# nucleus lies inside them (exact), else it falls back to a full sort. Avoids sorting the vocabulary per row.
_NUCLEUS_PROBE = 1024


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (residuals p - q need the precision)."""
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """logits [rows, V] -> probabilities [rows, V] (float64), after temperature, top-k, top-p, min-p."""
    logits = np.atleast_2d(logits)
    if params.greedy:
        probs = np.zeros(logits.shape, dtype=np.float64)
        probs[np.arange(len(logits)), logits.argmax(axis=-1)] = 1.0
        return probs
    probs = softmax(logits / params.temperature)
    for row in probs:
        _filter_row(row, params)
    return probs


def _filter_row(p: np.ndarray, params: SamplingParams) -> None:
    """In place: zero what top-k, top-p and min-p cut, renormalise."""
    V = p.shape[0]
    if 0 < params.top_k < V:
        cut = np.argpartition(p, V - params.top_k)[: V - params.top_k]
        p[cut] = 0.0
        p /= p.sum()
    if params.top_p < 1.0:
        _top_p(p, params.top_p)
    if params.min_p > 0.0:
        p[p < params.min_p * p.max()] = 0.0
        p /= p.sum()


def _top_p(p: np.ndarray, top_p: float) -> None:
    V = p.shape[0]
    m = min(_NUCLEUS_PROBE, V)
    idx = np.argpartition(p, V - m)[V - m:] if m < V else np.arange(V)
    idx = idx[np.argsort(-p[idx], kind="stable")]
    cum = np.cumsum(p[idx])
    if cum[-1] < top_p and m < V:  # nucleus larger than the probe: sort everything
        idx = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[idx])
    keep = int(np.searchsorted(cum, top_p) + 1)  # smallest prefix with mass >= top_p
    mask = np.zeros(V, dtype=bool)
    mask[idx[:keep]] = True
    p[~mask] = 0.0
    p /= p.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from a probability row by inverse CDF (one uniform, no vocab-sized temporaries but cumsum)."""
    c = np.cumsum(probs)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(probs) - 1))
