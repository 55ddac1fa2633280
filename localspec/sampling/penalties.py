"""Repetition, presence and frequency penalties, llama.cpp's semantics (src/llama-sampler.cpp, "penalties").

For each token seen c > 0 times in the last `repeat_last_n` tokens of a row's history: a positive logit is divided
by `repeat_penalty`, a logit <= 0 multiplied by it; then c × frequency_penalty + presence_penalty is subtracted.
The prompt counts as history (llama-server feeds the prompt's tokens to its sampler too).

The result is a patch, not a new row: (row index, token id, penalised logit) for the few dozen tokens each window
holds. Row r of a pass has seen one token more than row r-1, so a verify pass over drafts penalises every row
exactly as plain decoding would at that position: the drafter and the target see the same history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from .params import SamplingParams


def penalty_patch(logits: np.ndarray, params: "SamplingParams", history: Sequence[int],
                  drafts: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rows, ids, penalised logits) for logits [R, V] whose last row has seen history + drafts; None if no token
    is in any window."""
    windows = _windows(len(logits), params.repeat_last_n, history, drafts)
    R, n = windows.shape
    if n == 0:
        return None
    s = np.sort(windows, axis=1).ravel()
    first = np.ones(s.size, dtype=bool)  # runs of one id within one row's sorted window
    first[1:] = s[1:] != s[:-1]
    first[::n] = True
    starts = np.flatnonzero(first)
    counts = np.concatenate((starts[1:], [s.size])) - starts
    real = s[starts] >= 0  # -1 pads windows shorter than n
    starts, counts = starts[real], counts[real].astype(logits.dtype)
    if starts.size == 0:
        return None
    rows, ids = starts // n, s[starts]
    lg = logits[rows, ids]
    f = logits.dtype.type
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = np.where(lg <= 0, lg * f(params.repeat_penalty), lg / f(params.repeat_penalty))
        out -= counts * f(params.frequency_penalty) + f(params.presence_penalty)
    # extreme penalties overflow float32: keep every logit finite, or softmax's max - max would be NaN
    big = np.finfo(logits.dtype).max
    out = np.clip(np.where(np.isnan(out), lg, out), -big, big)
    return rows, ids, out.astype(logits.dtype)


def _windows(n_rows: int, last_n: int, history: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
    """[n_rows, n] int64: the last n tokens each row has seen, -1 where its history is shorter."""
    if len(drafts) < n_rows - 1:
        raise ValueError(f"{n_rows} logit rows need at least {n_rows - 1} drafts in their history, got {len(drafts)}")
    n = last_n if last_n > 0 else len(history) + len(drafts)  # -1: the whole history
    if n == 0:
        return np.empty((n_rows, 0), dtype=np.int64)
    need = n + n_rows - 1  # tokens that any row's window reaches back to
    tail = np.asarray([*history[max(0, len(history) - need):], *drafts], dtype=np.int64)[-need:]
    padded = np.concatenate([np.full(need - len(tail), -1, dtype=np.int64), tail])
    return padded[np.arange(n_rows)[:, None] + np.arange(n)]  # row r = padded[r : r + n]
