"""A fast path's trial, in the child process fastpath.Trial starts:
`python -m localspec.backend.fastpath_trial PATH MODE COUNTS`.

The child first runs a short decode on the reference path (mode none: no extra buffer type, plain llama.cpp),
then loads the model in the mode under trial and runs the same decode at each thread count, and once more. A
broken kernel either kills the child by a signal, which its parent reads as the verdict, or gives other logits
than the reference or than its own first run: the child then exits with MISMATCH_EXIT and says by how much. It
prints the largest distance it saw, so a verdict records its margin. A module of its own, so that the decision
(fastpath.py) does not import the model that imports it.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from ..errors import LocalspecError
from .fastpath import MISMATCH_EXIT, NONE, REPEAT_TOLERANCE, TOLERANCE, UNLOADABLE_EXIT
from .loading import LoadOptions
from .model import Model

BATCH, BATCH_ROWS, STEPS = 32, 4, 2  # a prompt chunk (its last rows' logits), then one-row steps after it
TEXT = ("The capital of France is Paris. It sits on the Seine, and its museums hold paintings from every century.\n"
        "def add(a, b):\n    return a + b\n") * 4  # prose and code: at least BATCH + STEPS tokens in any vocabulary


def short_decode(model: Model, n_threads: int) -> list[np.ndarray]:
    """The logits of a 32-token batch's last rows and of two one-row steps after it, from an empty cache: the
    batch takes the GEMM kernels, the steps the one-row ones and the state the batch left."""
    tokens = model.tokenize(TEXT, add_special=True)[:BATCH + STEPS]
    model.set_threads(n_threads, n_threads)
    out = [np.array(model.decode(tokens[:BATCH], BATCH_ROWS), dtype=np.float64)]
    out += [np.array(model.decode([t], 1), dtype=np.float64) for t in tokens[BATCH:]]
    model.rewind(0)
    return out


SHARPNESS = 3.0  # a trained model's logits have a standard deviation near 3 (SmolLM2, Gemma-3): rows scaled to it


def _distribution(rows: np.ndarray) -> np.ndarray:
    """Each row's next-token distribution at the temperature that gives its logits a standard deviation of
    SHARPNESS: a trained model's own, near enough, and a random-weight model's flat rows made as peaked."""
    z = SHARPNESS * (rows - rows.mean(axis=1, keepdims=True)) / (rows.std(axis=1, keepdims=True) + 1e-12)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def distance(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> float:
    """The largest total variation distance between a row's next-token distribution (`_distribution`) and the
    reference's: 0 for the same logits, up to 0.06 for llama.cpp's repacked kernels against its plain ones,
    near 1 for logits one token along (docs/bench/fastpath.md#the-trial). NaN when a row has a NaN."""
    worst = 0.0
    for ref, got in zip(reference, candidate):
        tv = 0.5 * np.abs(_distribution(ref) - _distribution(got)).sum(axis=1)
        if not np.isfinite(tv).all():
            return float("nan")
        worst = max(worst, float(tv.max()))
    return worst


def spread(first: Sequence[np.ndarray], again: Sequence[np.ndarray]) -> float:
    """The largest difference of a logit between two runs of the same decode, in standard deviations of its row:
    0 for a kernel that gives one answer (llama.cpp's CPU kernels do, at any thread count)."""
    worst = 0.0
    for a, b in zip(first, again):
        d = np.abs(a - b) / (a.std(axis=1, keepdims=True) + 1e-12)
        worst = max(worst, float(d.max()) if np.isfinite(d).all() else float("inf"))
    return worst


def _load(path: str, mode: str) -> Model:
    return Model.load(path, LoadOptions(n_ctx=128, n_batch=64, fast_path=mode, mmap=True))


def trial(path: str, mode: str, counts: str) -> int:
    """The trial of `mode` at the thread `counts` ("1,2"): 0 when every decode matched the reference within
    TOLERANCE and gave the same logits again, MISMATCH_EXIT when one did not, UNLOADABLE_EXIT when the file
    would not load."""
    threads = [int(c) for c in counts.split(",")]
    try:
        model = _load(path, NONE)
    except LocalspecError as e:
        print(e, file=sys.stderr)
        return UNLOADABLE_EXIT
    reference = short_decode(model, 1)
    model.close()
    model = _load(path, mode)
    runs = {n: short_decode(model, n) for n in threads}
    again = short_decode(model, threads[-1])
    model.close()
    worst = max(distance(reference, run) for run in runs.values())
    moved = spread(runs[threads[-1]], again)
    print(f"{worst:.3g}")
    if not worst <= TOLERANCE:  # a NaN is a mismatch too
        print(f"next-token distributions {worst:.2g} from the reference's (total variation; tolerance {TOLERANCE})",
              file=sys.stderr)
        return MISMATCH_EXIT
    if not moved <= REPEAT_TOLERANCE:
        print(f"the same decode gave other logits the second time ({moved:.2g} standard deviations)",
              file=sys.stderr)
        return MISMATCH_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(trial(*sys.argv[1:]))
