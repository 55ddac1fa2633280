"""Sampling parameters and the warp from logits to the final sampling distribution, llama.cpp's way.

The chain is llama.cpp's default order (common/sampling.cpp): penalties → top-k → top-p → min-p → temperature.
Top-k, top-p and min-p see the UNTEMPERED distribution; the temperature is applied last, to the tokens that
survive. Top-p normalises over what top-k left (the whole vocabulary when top-k is off); min-p keeps the tokens
whose probability is at least min_p × the top one. Temperature 0 (or top-k 1) is greedy: the argmax of the
penalised row, no probabilities. Editors' requests add llama.cpp's infill step after the filters
(`params.infill`, infill.py): it narrows the kept set, and the temperature applies to what it keeps.

`warp` is applied identically to the target's rows (p) and the drafter's rows (q), with the same token history
for each position (row i of a verify pass has seen the context and drafts[:i]): that is what makes the verify
rule's p and q comparable, penalties included.

Cost: the result is sparse (`Warped`: candidate ids and their probabilities). Each pass over the vocabulary is a
float32 numpy pass (a compare, plus a max or an exp where the filter needs it); everything after the cut works on
the candidates only, in float64, whose cost does not depend on the vocabulary.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .infill import infill_keep
from .params import SamplingParams
from .penalties import penalty_patch

_SUBSAMPLE = 2048  # top-k's threshold is estimated from a strided sample of about this many logits per row
_NUCLEUS_EPS = (1e-4, 1e-8)  # top-p alone: candidate cuts tried at p_max × eps before the whole vocabulary

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, eq=False)  # arrays: compared by identity, never elementwise by accident
class Warped:
    """Final sampling distributions of `rows` positions, sparse: row r puts probs[r, j] on token ids[r, j].

    Ids are unique within a row; -1 pads short rows (probability 0). Rows sum to 1."""

    ids: np.ndarray  # int64 [rows, m]
    probs: np.ndarray  # float64 [rows, m]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def prob(self, tokens: Sequence[int]) -> np.ndarray:
        """Probability of tokens[r] in row r, for the first len(tokens) rows: float64 [len(tokens)]."""
        n = len(tokens)
        hit = self.ids[:n] == np.asarray(tokens, dtype=np.int64)[:, None]
        return np.where(hit, self.probs[:n], 0.0).sum(axis=1)

    def at(self, row: int, ids: np.ndarray) -> np.ndarray:
        """Probability of each of `ids` in row `row` (0 outside its support)."""
        order = np.argsort(self.ids[row], kind="stable")
        own = self.ids[row][order]
        pos = np.minimum(np.searchsorted(own, ids), len(own) - 1)
        return np.where(own[pos] == ids, self.probs[row][order][pos], 0.0)

    def sample(self, rng: np.random.Generator, row: int = 0) -> int:
        """Draw one token from row `row`: one `rng.random()`, the inverse CDF at it (`pick`). Plain decoding and
        every verify row draw this way, one call per emitted position, so a seed gives one text whatever the
        drafts (docs/sampling.md, "Which rule runs when")."""
        return self.pick(row, rng.random())

    def pick(self, row: int, u: float) -> int:
        """The token at uniform `u` in [0, 1) of row `row`'s CDF, its candidates in ascending id order (`warp`
        writes every row in that order, so the answer depends on the row's distribution only, not on the
        rows or padding beside it, and a drafter's q and the target's p are walked in the same order)."""
        probs = self.probs[row]
        c = np.cumsum(probs)
        j = int(np.searchsorted(c, u * c[-1], side="right"))
        if j >= len(c) or not probs[j] > 0.0:  # u × total rounded up to the total: the last token with mass
            live = np.flatnonzero(probs > 0.0)
            if live.size == 0:
                raise ValueError("the sampling parameters leave no token with a probability above 0")
            j = int(live[-1])
        return int(self.ids[row, j])

    def dense(self, n_vocab: int) -> np.ndarray:
        """[rows, n_vocab] float64 (tests and small vocabularies)."""
        out = np.zeros((len(self), n_vocab))
        rows, cols = np.nonzero(self.ids >= 0)
        out[rows, self.ids[rows, cols]] = self.probs[rows, cols]
        return out


def point_masses(tokens: np.ndarray) -> Warped:
    """Greedy rows: probability 1 on each token."""
    tokens = np.asarray(tokens, dtype=np.int64)
    return Warped(tokens[:, None], np.ones((len(tokens), 1)))


def stack(rows: Sequence[Warped]) -> Warped:
    """Concatenate warped rows (e.g. a drafter's, one position at a time), padding to the widest."""
    m = max(w.ids.shape[1] for w in rows)
    ids = np.concatenate([np.pad(w.ids, ((0, 0), (0, m - w.ids.shape[1])), constant_values=-1) for w in rows])
    probs = np.concatenate([np.pad(w.probs, ((0, 0), (0, m - w.probs.shape[1]))) for w in rows])
    return Warped(ids, probs)


def warp(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (),
         drafts: Sequence[int] = ()) -> Warped:
    """logits [rows, V] -> the final sampling distribution of each row (penalties, top-k, top-p, min-p, temp).

    The last row has seen history + drafts, each earlier row one token less (a verify pass: row i has seen the
    context and drafts[:i]); only the penalties look at them. `logits` is left as it was."""
    if params.greedy:
        return point_masses(greedy(logits, params, history, drafts))
    logits = np.atleast_2d(logits)
    patch = penalty_patch(logits, params, history, drafts) if params.penalised else None
    with _patched(logits, patch) as row_logits:
        vals, ids, z = _candidates(row_logits, params)
    return _filter(vals, ids, z, params)


def greedy(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (),
           drafts: Sequence[int] = ()) -> np.ndarray:
    """The greedy choice of each row (the argmax of the penalised logits) as int64 [rows]: `warp` at T = 0
    without building point masses. The verify loop calls it every round, right after a decode has pushed the
    interpreter out of the CPU caches, where each numpy call costs ~10× its warm time (measured: warp's greedy
    branch 55 µs a token, this ~18), so it does the least it can. With the infill sampler before a temperature
    of 0, the argmax is taken over what the infill step keeps (llama.cpp's chain does the same)."""
    if params.infill is not None and not params.infill.tempered and params.top_k != 1:
        w = warp(logits, replace(params, temperature=1.0), history, drafts)
        return w.ids[np.arange(len(w)), w.probs.argmax(axis=1)]
    if not params.penalised:
        return (logits if logits.ndim == 2 else logits[None]).argmax(axis=1)
    logits = np.atleast_2d(logits)
    with _patched(logits, penalty_patch(logits, params, history, drafts)) as row_logits:
        return row_logits.argmax(axis=1)


@contextmanager
def _patched(logits: np.ndarray, patch: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> Iterator[np.ndarray]:
    """The logits with the penalised entries written in, for the duration of the block (a few dozen writes
    instead of a copy of every row); the caller's array is restored on exit."""
    if patch is None:
        yield logits
        return
    if not logits.flags.writeable:
        logits = logits.copy()
    rows, ids, penalised = patch
    saved = logits[rows, ids]
    logits[rows, ids] = penalised
    try:
        yield logits
    finally:
        logits[rows, ids] = saved


def _candidates(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A superset of what the filters keep, per row: (logits, ids) padded to [rows, w] with (-inf, -1), and the
    full-vocabulary normaliser Σ exp(l - max) when top-p needs it (top-k off), else None.

    Exact: top-k's cut is at or below the k-th largest logit; min-p's at max + log(min_p); top-p alone keeps a
    cut whose mass reaches top_p (the nucleus is a prefix of the sorted order, so it lies inside)."""
    R, V = logits.shape
    k = params.top_k if params.top_k < V else 0
    if k:
        t = _kth_bound(logits, k)
        vals, ids, counts = _gather(logits, t)
        short = counts < k  # the sample's estimate was too high (rare): the exact k-th largest
        if short.any():
            t[short] = np.partition(logits[short], V - k, axis=1)[:, V - k]
            vals, ids, _ = _gather(logits, t)
        return vals, ids, None  # top-p normalises over top-k's survivors: all among the candidates
    if params.top_p == 1.0 and params.min_p == 0.0:
        return *_gather(logits, np.full(R, -np.inf, dtype=logits.dtype))[:2], None  # temperature only: every token
    mx = logits.max(axis=1)
    z = None
    if params.top_p < 1.0:  # top-p normalises over the whole vocabulary: one exp pass
        e = logits - mx[:, None]
        np.exp(e, out=e)
        z = e.sum(axis=1, dtype=np.float64)
    if params.min_p > 0.0:
        t = mx + np.float32(math.log(params.min_p))
    else:
        assert z is not None  # top_p < 1 here: the temperature-only case returned above
        t = _nucleus_bound(logits, e, z, mx, params.top_p)
    return *_gather(logits, t)[:2], z


def _kth_bound(logits: np.ndarray, k: int) -> np.ndarray:
    """Per row, a logit that is at most the k-th largest with high probability, from a strided sample: if the
    sample holds fewer than j of the top k (Poisson with mean k/s), its j-th largest lies below them all."""
    V = logits.shape[1]
    s = max(1, V // _SUBSAMPLE)
    sub = logits[:, ::s]
    lam = k / s
    j = min(sub.shape[1], math.ceil(lam + 4.0 * math.sqrt(lam)) + 2)
    return np.partition(sub, sub.shape[1] - j, axis=1)[:, sub.shape[1] - j].copy()


def _nucleus_bound(logits: np.ndarray, e: np.ndarray, z: np.ndarray, mx: np.ndarray, top_p: float) -> np.ndarray:
    """Top-p alone: per row, the highest cut among p_max × eps whose candidates hold top_p of the mass
    (e = exp(logits - max), z its row sums); -inf when none does."""
    t = np.full(len(logits), -np.inf, dtype=logits.dtype)
    todo = np.ones(len(logits), dtype=bool)
    for eps in _NUCLEUS_EPS:
        cut = mx + np.float32(math.log(eps))
        mass = e.sum(axis=1, dtype=np.float64, where=logits >= cut[:, None])
        ok = todo & (mass >= top_p * z)
        t[ok] = cut[ok]
        todo &= ~ok
        if not todo.any():
            break
    return t


def _gather(logits: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries with logit >= t[row], left-aligned per row: (logits, ids) [rows, w] padded with (-inf, -1),
    and the count per row. One compare pass over the rows; flatnonzero on the flat mask (2-D nonzero is slow)."""
    R, V = logits.shape
    flat = np.flatnonzero((logits >= t[:, None]).ravel())
    rows = flat // V
    counts = np.bincount(rows, minlength=R)
    pos = np.arange(flat.size) - (np.cumsum(counts) - counts)[rows]
    w = max(int(counts.max()), 1)
    vals = np.full((R, w), -np.inf, dtype=logits.dtype)
    ids = np.full((R, w), -1, dtype=np.int64)
    vals[rows, pos] = logits.ravel()[flat]
    ids[rows, pos] = flat - rows * V
    return vals, ids, counts


def _top_k_columns(vals: np.ndarray, k: int) -> np.ndarray:
    """Per row, the columns of its k largest values, in their own (ascending id) order; among values tied
    with the k-th, the first columns. A function of the row alone: a verify row and the same row decoded on
    its own keep the same tokens in the same order (argpartition's choice among ties depends on the width)."""
    kth = -np.partition(-vals, k - 1, axis=1)[:, k - 1:k]
    above = vals > kth
    tied = vals == kth
    sel = above | (tied & (np.cumsum(tied, axis=1) <= k - above.sum(axis=1, keepdims=True)))
    return np.nonzero(sel)[1].reshape(len(vals), k)


def _filter(vals: np.ndarray, ids: np.ndarray, z: np.ndarray | None, params: SamplingParams) -> Warped:
    """Top-k, top-p, min-p on the untempered candidates, then the temperature over what is kept. The candidates
    come in ascending id order per row (`_gather`) and stay in it (`Warped.pick` walks them so)."""
    R, w = vals.shape
    r = np.arange(R)[:, None]
    if 0 < params.top_k < w:
        top = _top_k_columns(vals, params.top_k)
        vals, ids = vals[r, top], ids[r, top]
    mx = vals.max(axis=1, keepdims=True)
    keep = ids >= 0
    if params.top_p < 1.0:  # the smallest prefix of the sorted candidates whose mass reaches top_p
        order = np.argsort(-vals, axis=1, kind="stable")  # ties: the lower id first
        e = np.exp(vals[r, order].astype(np.float64) - mx)
        norm = e.sum(axis=1) if z is None else z  # over top-k's survivors, else the whole vocabulary
        n = np.count_nonzero(np.cumsum(e, axis=1) < params.top_p * norm[:, None], axis=1) + 1
        in_prefix = np.empty_like(keep)
        in_prefix[r, order] = np.arange(vals.shape[1]) < n[:, None]  # back in ascending id order
        keep &= in_prefix
    if params.min_p > 0.0:  # llama.cpp compares logits: l >= l_max + log(min_p), in float32
        keep &= vals >= mx + np.float32(math.log(params.min_p))
    if params.infill is not None:  # editors' chain: top-k, top-p, infill (a set; the temperature still applies)
        vals, ids, keep = infill_keep(vals, ids, keep, params.temperature, params.infill)
    cols = keep.any(axis=0)
    vals, ids, keep = vals[:, cols], ids[:, cols], keep[:, cols]
    et = np.where(keep, np.exp((vals.astype(np.float64) - mx) / params.temperature), 0.0)
    return Warped(np.where(keep, ids, -1), et / et.sum(axis=1, keepdims=True))
