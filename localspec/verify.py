"""The verify rule, as pure functions of arrays and an RNG (see shared/design.md, "The verify rule").

Shapes: k draft tokens; p is the target's final distribution for the k+1 verified positions [k+1, V];
q is the drafter's distribution for the k draft positions [k, V], or None for a deterministic drafter
(prompt lookup, greedy draft), whose q is a point mass on the draft token.

Each function returns (n_accepted, next_token): the first n_accepted drafts are kept, then next_token,
which is either the correction drawn at the first rejection or the bonus token when all k pass.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import sample


def verify_greedy(target_argmax: Sequence[int], draft: Sequence[int]) -> tuple[int, int]:
    """T = 0: accept while the draft equals the target's argmax; then emit the target's argmax."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, int(target_argmax[n])


def verify(p: np.ndarray, draft: Sequence[int], q: np.ndarray | None,
           rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the output is distributed exactly as p."""
    for i, d in enumerate(draft):
        p_d = p[i, d]
        q_d = 1.0 if q is None else q[i, d]
        # q(d) <= p(d): always accept; else accept with probability p(d)/q(d)
        if q_d <= p_d or rng.random() * q_d < p_d:
            continue
        return i, sample(residual(p[i], d, None if q is None else q[i]), rng)
    return len(draft), sample(p[len(draft)], rng)


def residual(p: np.ndarray, d: int, q: np.ndarray | None) -> np.ndarray:
    """max(0, p - q) over the WHOLE vocabulary (unnormalised; `sample` normalises by the total)."""
    if q is None:  # point mass on d: max(0, p - 1[d]) is p with d removed
        r = p.copy()
        r[d] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    if r.sum() <= 0.0:  # p == q: rejection has probability 0, kept for float safety
        return p
    return r
