"""The verify rules, as pure functions of arrays and an RNG (docs/sampling.md, "Which rule runs when").

Shapes: k draft tokens; p holds the target's final distributions for the k+1 verified positions (a `Warped`, k+1
rows); q the drafter's for the k draft positions (k rows) when the drafter drew its tokens from q with draws of
its own, or None when the draft is a function of the context and the request's RNG state (prompt lookup, a
greedy draft, a model draft drawn with the target's own next uniforms: drafters.ModelDrafter).

- q is None: `verify_same_seed`. Each position is sampled from p_i exactly as plain decoding samples it (one
  `rng.random()` a position, `Warped.sample`); a draft token is kept when it equals that sample. The emitted
  tokens are, draw for draw, plain decoding's with the same seed: the same text with speculation on or off.
- q given: speculative sampling (`verify_rejection`): accept d_i with probability min(1, p_i(d_i)/q_i(d_i)),
  else draw from max(0, p_i - q_i). Exact in distribution, but the random stream follows the drafts.

The distributions are sparse (candidate ids and probabilities), and that is exact: acceptance needs p(d) and q(d)
only, and the residual max(0, p − q) is zero wherever p is, so it lives on p's candidates.

Each function returns (n_accepted, next_token): the first n_accepted drafts are kept, then next_token,
which is either the target's own token at the first mismatch or the bonus token when all k pass.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sampling.warp import Warped


def verify_greedy(target_argmax: Sequence[int] | np.ndarray, draft: Sequence[int]) -> tuple[int, int]:
    """T = 0: accept while the draft equals the target's argmax; then emit the target's argmax."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, int(target_argmax[n])


def verify(p: Warped, draft: Sequence[int], q: Warped | None, rng: np.random.Generator) -> tuple[int, int]:
    """The rule the draft calls for: `verify_same_seed` when q is None, else `verify_rejection`."""
    if q is None:
        return verify_same_seed(p, draft, rng)
    return verify_rejection(p, draft, q, rng)


def verify_same_seed(p: Warped, draft: Sequence[int], rng: np.random.Generator) -> tuple[int, int]:
    """Sample x_i from p_i with the request's RNG, one draw a position, in order; keep d_i while x_i == d_i; emit
    the first x_i that differs, or the bonus x_{k+1} when every draft matched. k = 0 is plain decoding.

    Exact when the draft does not depend on the draws it is compared with, and more: x_i is the token plain
    decoding draws at that position from the same RNG state (row i has seen context + d_<i = x_<i), so the
    output is plain decoding's own, token for token. For a point-mass draft the acceptance is p_i(d_i), as
    speculative sampling's."""
    k = len(draft)
    for i in range(k):
        x = p.sample(rng, i)
        if x != draft[i]:
            return i, x
    return k, p.sample(rng, k)


def verify_rejection(p: Warped, draft: Sequence[int], q: Warped, rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), for drafts drawn from q with draws of
    the drafter's own: the output is distributed exactly as p."""
    k = len(draft)
    if k == 0:  # plain decoding
        return 0, p.sample(rng, 0)
    p_d = p.prob(draft)
    q_d = q.prob(draft)
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
