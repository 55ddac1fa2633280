"""Log-probabilities of emitted tokens under the target's own distribution (OpenAI `logprobs`, llama.cpp
`n_probs`), taken from the rows the verify pass already computed: no extra target pass.

"Own distribution" is the softmax of the target's raw logits (temperature 1, before top-k/top-p and before
any constraint), as llama-server and OpenAI report it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the n most likely tokens at this position, most likely first


def log_softmax(row: np.ndarray) -> np.ndarray:
    z = row.astype(np.float64) - np.max(row)
    return z - np.log(np.exp(z).sum())


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], n_top: int | None) -> tuple[TokenLogprob, ...]:
    """rows [>= len(tokens), V]: row i is the distribution tokens[i] was drawn from. n_top None = not asked."""
    if n_top is None:
        return ()
    out = []
    for i, t in enumerate(tokens):
        lp = log_softmax(rows[i])
        top: tuple[tuple[int, float], ...] = ()
        if n_top > 0:
            n = min(n_top, len(lp))
            idx = np.argpartition(-lp, n - 1)[:n]
            idx = idx[np.argsort(-lp[idx], kind="stable")]
            top = tuple((int(j), float(lp[j])) for j in idx)
        out.append(TokenLogprob(int(t), float(lp[t]), top))
    return tuple(out)
