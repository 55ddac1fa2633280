"""llama.cpp's `infill` sampler (src/llama-sampler.cpp, `llama_sampler_infill_apply`) as a step on a row's candidates.

Editors (llama.vim, llama.vscode) ask for the chain `top_k, top_p, infill`: after the filters, the infill step
decides between ending the fill (an end-of-generation token) and going on with text, and prunes the text tokens
to a few confident ones. On the candidates' probabilities p (softmax of their logits; tempered when the
temperature comes before it in the chain), with n candidates:

1. if 3 × p(EOG) × n > p(text), keep only the EOG tokens;
2. else merge tokens whose piece is a prefix of another's (the pair's mass goes to the likelier one, the other
   is dropped), in llama.cpp's pair order over the candidates sorted by descending probability;
3. drop text tokens under 0.2; if no text token is left, the row becomes EOT alone (EOS when the vocabulary has
   no EOT); else renormalise and drop text tokens under 1 / (text tokens kept + 1). EOG tokens always stay.

What the step leaves is a *set*: llama.cpp's `dist` then samples the softmax of the surviving logits (it
recomputes the probabilities from the logits, so the merged masses decide only who survives), and so does the
warp here. The probabilities are float64 here, float32 in llama.cpp: only a test that lands within rounding
of one of the thresholds can go the other way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

THRESHOLD = 0.2  # llama.cpp's first cut for text tokens
EOG_RATIO = 3.0  # EOG wins when EOG_RATIO × p_eog × n > p_txt


@dataclass(frozen=True, eq=False)
class Infill:
    """The vocabulary facts the step reads (backend.Model supplies them; sampling never loads llama.cpp), and
    where the step sits in the chain."""

    piece: Callable[[int], bytes]  # a token's bytes as llama.cpp renders it (special tokens: empty)
    is_eog: Callable[[int], bool]
    eot: int  # the fallback token: EOT, else EOS
    tempered: bool = False  # listed after `temperature`: it sees the tempered probabilities


def infill_keep(vals: np.ndarray, ids: np.ndarray, keep: np.ndarray, temperature: float,
                infill: Infill) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The warp's step: per row, `keep` narrowed to what the infill sampler keeps, given the candidates' logits
    `vals` and ids `ids` [rows, w]. One column is added for the EOT fallback; the arrays are new."""
    R, w = vals.shape
    vals = np.concatenate([vals, np.full((R, 1), -np.inf, dtype=vals.dtype)], axis=1)
    ids = np.concatenate([ids, np.full((R, 1), -1, dtype=ids.dtype)], axis=1)
    keep = np.concatenate([keep, np.zeros((R, 1), dtype=bool)], axis=1)
    scale = temperature if infill.tempered and temperature > 0 else 1.0
    for r in range(R):
        cols = np.flatnonzero(keep[r])
        if cols.size == 0:
            continue
        kept = keep_set(vals[r, cols].astype(np.float64) / scale, ids[r, cols].tolist(), infill)
        keep[r] = False
        if kept is None:  # nothing but EOG left: the row becomes the fallback token, in the added column
            ids[r, ids[r] == infill.eot] = -1
            ids[r, w], vals[r, w], keep[r, w] = infill.eot, vals[r, cols].max(), True
        else:
            keep[r, cols[kept]] = True
    return vals, ids, keep


def keep_set(logits: np.ndarray, ids: Sequence[int], infill: Infill) -> np.ndarray | None:
    """Which of one row's candidates (their logits, ids) the infill sampler keeps: a bool mask, or None when
    the row falls back to EOT alone."""
    order = np.argsort(-logits, kind="stable")  # llama.cpp sorts by descending logit (ties: the lower id)
    p = np.exp(logits[order] - logits[order[0]])
    p /= p.sum()
    toks = [ids[i] for i in order]
    eog = np.array([infill.is_eog(t) for t in toks], dtype=bool)
    mask = np.zeros(len(ids), dtype=bool)
    if EOG_RATIO * p[eog].sum() * len(toks) > p[~eog].sum():
        mask[order[eog]] = True
        return mask
    alive = _merge(p, [infill.piece(t) for t in toks], np.isfinite(logits[order]))
    first = alive & (eog | (p >= THRESHOLD))
    n_text = int(np.count_nonzero(first & ~eog))
    if n_text == 0:
        return None
    q = np.where(first, p, 0.0) / p[first].sum()
    final = first & (eog | (q >= 1.0 / (n_text + 1)))
    mask[order[final]] = True
    return mask


def _merge(p: np.ndarray, pieces: Sequence[bytes], alive: np.ndarray) -> np.ndarray:
    """llama.cpp's prefix merge, in place on `p` (sorted by descending probability): for i0, then i1, over the
    candidates still alive, when piece i0 is a non-empty prefix of piece i1 the less likely of the two gives
    its mass to the other and leaves (`alive` starts as the finite logits; llama.cpp skips -inf ones). Only
    prefix pairs change anything, so they are found first (a dict of pieces, O(n × piece length)) and visited
    in llama.cpp's (i0, i1) order. Returns the alive mask."""
    alive = alive.copy()
    for i0, i1 in _prefix_pairs(pieces):
        if not (alive[i0] and alive[i1]):
            continue
        dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
        p[dst] += p[src]
        p[src] = 0.0
        alive[src] = False
    return alive


def _prefix_pairs(pieces: Sequence[bytes]) -> list[tuple[int, int]]:
    """Every (i0, i1), i0 != i1, whose piece i0 is non-empty and a prefix of piece i1 (equal pieces included),
    sorted as llama.cpp's double loop meets them."""
    where: dict[bytes, list[int]] = {}
    for i, b in enumerate(pieces):
        if b:
            where.setdefault(b, []).append(i)
    pairs = [(i0, i1) for i1, b in enumerate(pieces) for n in range(1, len(b) + 1)
             for i0 in where.get(b[:n], ()) if i0 != i1]
    pairs.sort()
    return pairs
