"""The verify rule, as pure functions of arrays and an RNG (docs/sampling.md, "Why output stays lossless").

Shapes: k draft tokens; p holds the target's final distributions for the k+1 verified positions (a `Warped`, k+1
rows); q the drafter's for the k draft positions (k rows), or None for a deterministic drafter (prompt lookup,
greedy draft), whose q is a point mass on the draft token.

The distributions are sparse (candidate ids and probabilities), and that is exact: acceptance needs p(d) and q(d)
only, and the residual max(0, p − q) is zero wherever p is, so it lives on p's candidates.

Each function returns (n_accepted, next_token): the first n_accepted drafts are kept, then next_token,
which is either the correction drawn at the first rejection or the bonus token when all k pass.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import Warped


def verify_greedy(target_argmax: Sequence[int], draft: Sequence[int]) -> tuple[int, int]:
    """T = 0: accept while the draft equals the target's argmax; then emit the target's argmax."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, int(target_argmax[n])


def verify(p: Warped, draft: Sequence[int], q: Warped | None, rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the output is distributed exactly as p."""
    k = len(draft)
    if k == 0:  # plain decoding
        return 0, p.sample(rng, 0)
    p_d = p.prob(draft)
    q_d = np.ones(k) if q is None else q.prob(draft)
    u = rng.random(k)
    # q(d) <= p(d): always accept; else accept with probability p(d)/q(d)
    rejected = (q_d > p_d) & (u * q_d >= p_d)
    if not rejected.any():
        return k, p.sample(rng, k)
    i = int(rejected.argmax())
    return i, residual(p, i, int(draft[i]), q).sample(rng)


def residual(p: Warped, i: int, d: int, q: Warped | None) -> Warped:
    """max(0, p_i − q_i) normalised, over p_i's candidates (outside them p is 0, so the residual is too)."""
    ids, probs = p.ids[i], p.probs[i]
    q_at = (ids == d).astype(np.float64) if q is None else q.at(i, ids)  # point mass on d
    r = np.maximum(probs - q_at, 0.0)
    total = r.sum()
    if total <= 0.0:  # p == q: rejection has probability 0, kept for float safety
        return Warped(ids[None], probs[None])
    return Warped(ids[None], (r / total)[None])
