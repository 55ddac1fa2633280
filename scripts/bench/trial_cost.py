"""What the fast-path trial costs and how far each mode's logits are from the reference path (not a test).

Per model, with an empty verdict cache each time: `Model.load` with the trial running beside it (a first
load), then `Model.load` again (the verdict read from the cache), then `fastpath.choose` alone (the trial by
itself, in its child) and the cached verdict's read; and the trial's distances of modes all and repack from the
reference (docs/bench/fastpath.md#the-trial). Medians of --repeats. Prints one Markdown table.

    python scripts/bench/trial_cost.py --repeats 3 MODEL.gguf ...
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from localspec.backend import LoadOptions, Model, fastpath
from localspec.backend.fastpath_trial import _load, distance, short_decode


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _load_close(path: Path) -> Model:
    m = Model.load(path, LoadOptions(n_ctx=512))
    m.close()
    return m


def costs(path: Path, repeats: int) -> dict[str, float]:
    """Seconds (medians): first load, warm load, trial alone; milliseconds: the cached verdict's read."""
    rows: dict[str, list[float]] = {"first": [], "warm": [], "trial": [], "read_ms": []}
    for _ in range(repeats):
        os.environ["LOCALSPEC_CALIBRATION"] = tempfile.mkdtemp(prefix="trial-cost-")
        rows["first"].append(_timed(lambda: _load_close(path)))
        rows["warm"].append(_timed(lambda: _load_close(path)))
        rows["read_ms"].append(1e3 * _timed(lambda: fastpath.choose(path)))
        os.environ["LOCALSPEC_CALIBRATION"] = tempfile.mkdtemp(prefix="trial-cost-")
        rows["trial"].append(_timed(lambda: fastpath.choose(path)))
    return {k: statistics.median(v) for k, v in rows.items()}


def distances(path: Path) -> dict[str, float]:
    """Each mode's distance from the reference path at one thread (the trial's measure)."""
    m = _load(str(path), fastpath.NONE)
    ref = short_decode(m, 1)
    m.close()
    out = {}
    for mode in (fastpath.ALL, fastpath.REPACK):
        m = _load(str(path), mode)
        out[mode] = distance(ref, short_decode(m, 1))
        m.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| model | first load (s) | warm load (s) | trial alone (s) | cached verdict (ms) | all | repack |")
    print("|---|---|---|---|---|---|---|")
    for path in args.models:
        c, d = costs(path, args.repeats), distances(path)
        print(f"| {path.name} | {c['first']:.2f} | {c['warm']:.2f} | {c['trial']:.2f} | {c['read_ms']:.1f} "
              f"| {d['all']:.3g} | {d['repack']:.3g} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
