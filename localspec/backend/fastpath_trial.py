"""A fast path's trial. The child process fastpath.Trial starts, `python -m localspec.backend.fastpath_trial PATH
MODE COUNTS OUT`, loads the model in the mode under trial and runs a short decode at each thread count, and once
more; the parent, meanwhile, runs the same decode on the reference path (mode none: no extra buffer type, plain
llama.cpp, safe in any process) and compares (`reference`, `compare`).

A broken kernel either kills the child by a signal, which its parent reads as the verdict, or gives other logits
than its own first run (the child then exits with MISMATCH_EXIT and says by how much) or than the reference (the
parent finds it in the logits the child wrote to OUT). The parent keeps the largest distance, so a verdict records
its margin. A module of its own, so that the decision (fastpath.py) does not import the model that imports it.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from ..errors import LocalspecError
from .fastpath import MISMATCH_EXIT, NONE, REPEAT_TOLERANCE, TOLERANCE
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


def _load(path: str, mode: str, verbose: bool = False) -> Model:
    return Model.load(path, LoadOptions(n_ctx=128, n_batch=64, fast_path=mode, mmap=True, verbose=verbose))


def reference(path: str, verbose: bool = False) -> list[np.ndarray]:
    """The short decode on the reference path at one thread, in this process (the parent, while its child runs
    the mode under trial): plain llama.cpp, the path every mode is measured against. Raises LocalspecError when
    the file does not load."""
    model = _load(path, NONE, verbose)
    try:
        return short_decode(model, 1)
    finally:
        model.close()


def compare(reference_rows: Sequence[np.ndarray], out: str) -> tuple[float, str | None]:
    """The largest distance of the child's decodes (written to `out`) from the reference's, and why they fail
    the trial, or None when every one is within TOLERANCE."""
    with np.load(out) as saved:
        runs: dict[str, list[np.ndarray]] = {}
        for name in sorted(saved.files, key=lambda k: [int(x) for x in k.split("_")]):
            runs.setdefault(name.split("_")[0], []).append(saved[name].astype(np.float64))
    worst = max((distance(reference_rows, run) for run in runs.values()), default=float("nan"))
    if worst <= TOLERANCE:  # a NaN is a mismatch too
        return worst, None
    return worst, f"next-token distributions {worst:.2g} from the reference's (total variation; tolerance {TOLERANCE})"


def trial(path: str, mode: str, counts: str, out: str) -> int:
    """The child's side of the trial of `mode` at the thread `counts` ("1,2"): 0 when every decode ran and the
    repeat gave the same logits (its decodes are then in `out`, for the parent to compare with the reference),
    MISMATCH_EXIT when the repeat did not, 1 when the model would not load in that mode."""
    threads = [int(c) for c in counts.split(",")]
    try:
        model = _load(path, mode)
    except LocalspecError as e:  # the parent's reference load says whether the file loads at all
        print(e, file=sys.stderr)
        return 1
    runs = {n: short_decode(model, n) for n in threads}
    again = short_decode(model, threads[-1])
    model.close()
    moved = spread(runs[threads[-1]], again)
    if not moved <= REPEAT_TOLERANCE:
        print(f"the same decode gave other logits the second time ({moved:.2g} standard deviations)",
              file=sys.stderr)
        return MISMATCH_EXIT
    # float32, as llama.cpp computed them: exact, and half the bytes (Gemma's 262k-token rows: 6 MB a run)
    arrays: dict[str, Any] = {f"{n}_{i}": rows.astype(np.float32)
                              for n, run in runs.items() for i, rows in enumerate(run)}
    np.savez(out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(trial(*sys.argv[1:]))
