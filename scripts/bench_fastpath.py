"""What llama.cpp's extra CPU buffer types are worth, per weight type of the shipped models, and what the test load
that chooses them costs (docs/models.md, "CPU fast paths").

For each model and each mode (all: llama.cpp's default; repack: CPU_REPACK alone, by tensor overrides; none:
--no-repack) it times prompt evaluation (a chunk of --pp tokens) and decoding (--tg one-row steps), the modes
in turn within each repeat (each mode first in turn), and prints medians. Then, with an empty verdict cache, the
first start's test load per model and a warm start's cost (reading the cached verdict).

usage: python scripts/bench_fastpath.py [--models smollm2-135m,gemma3-270m,FILE.gguf] [--threads 2] [--repeats 5]
A Q4_0 copy of SmolLM2 (a weight type CPU_REPACK takes):
localspec.models.gguf_tools.write_requantized(src, dst, "Q4_0").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np


def _paths(names: list[str]):
    from pathlib import Path

    from localspec.models.registry import load_registry
    from localspec.models.resolve import entry_path

    reg = load_registry()
    return {Path(n).name if Path(n).is_file() else n:
            Path(n) if Path(n).is_file() else entry_path(reg.models[n], log=lambda *a: None) for n in names}


def _time(model, pp: int, tg: int) -> tuple[float, float]:
    """(prompt tok/s, decode tok/s) from an empty cache."""
    toks = [(7 + 31 * i) % model.n_vocab for i in range(pp)]
    model.rewind(0)
    t0 = time.perf_counter()
    logits = model.decode(toks, 1)
    t1 = time.perf_counter()
    nxt = int(np.argmax(logits[0]))
    for _ in range(tg):
        nxt = int(np.argmax(model.decode([nxt], 1)[0]))
    t2 = time.perf_counter()
    return pp / (t1 - t0), tg / (t2 - t1)


def speeds(paths: dict, threads: int, repeats: int, pp: int, tg: int) -> list[dict]:
    from localspec.backend import LoadOptions, Model
    from localspec.models.gguf_header import read_header
    from localspec.models.model_facts import _params_by_type

    rows = []
    for name, path in paths.items():
        models = {m: Model.load(path, LoadOptions(n_ctx=pp + tg + 8, n_threads=threads, fast_path=m))
                  for m in ("all", "repack", "none")}
        for m in models.values():
            m.set_threads(threads, threads)
            _time(m, pp, 4)  # warm-up
        got: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
        order = list(models)
        for i in range(repeats):
            for mode in order[i % 3:] + order[:i % 3]:  # each mode first in turn: no order bias
                got[mode].append(_time(models[mode], pp, tg))
        types = _params_by_type(read_header(path, tokens=False), min_dims=2)
        total = sum(types.values())
        mix = ", ".join(f"{t} {100 * n / total:.0f} %" for t, n in sorted(types.items(), key=lambda x: -x[1]))
        for mode, m in models.items():
            rows.append({"model": name, "weights": mix, "mode": mode, "repacked": len(m.fast_path.repacked),
                         "pp_tok_s": statistics.median(p for p, _ in got[mode]),
                         "tg_tok_s": statistics.median(t for _, t in got[mode])})
            m.close()
    return rows


def _load_s(path) -> tuple[float, str]:
    from localspec.backend import LoadOptions, Model

    t0 = time.perf_counter()
    m = Model.load(path, LoadOptions(n_ctx=512))
    seconds, source = time.perf_counter() - t0, m.fast_path.source
    m.close()
    return seconds, source


def probe_costs(paths: dict, repeats: int) -> list[dict]:
    """Per model: the test load alone (empty cache), a warm start's cached read, and what a first start's
    Model.load costs with an empty cache against one with the verdict cached (the test load overlaps the load)."""
    from localspec.backend import fastpath

    out = []
    for name, path in paths.items():
        row: dict = {"model": name, "alone_s": [], "warm_ms": [], "first_load_s": [], "cached_load_s": []}
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as d:
                os.environ["LOCALSPEC_CALIBRATION"] = d
                t0 = time.perf_counter()
                row["mode"] = fastpath.choose(path).mode
                row["alone_s"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                fastpath.choose(path)
                row["warm_ms"].append(1000 * (time.perf_counter() - t0))
            with tempfile.TemporaryDirectory() as d:
                os.environ["LOCALSPEC_CALIBRATION"] = d
                first, src1 = _load_s(path)
                cached, src2 = _load_s(path)
                assert (src1, src2) == ("probe", "cache"), (src1, src2)
                row["first_load_s"].append(first)
                row["cached_load_s"].append(cached)
        out.append({k: statistics.median(v) if isinstance(v, list) else v for k, v in row.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    from localspec.backend import system_info

    load = open("/proc/loadavg").read().split()[:3]
    paths = _paths(a.models.split(","))
    rows = speeds(paths, a.threads, a.repeats, a.pp, a.tg)
    costs = probe_costs(paths, max(1, a.repeats // 2))
    print(f"system: {system_info().strip()}\nload before: {' '.join(load)}")
    print(f"\n| model | matrix weights | mode | tensors repacked by override | pp{a.pp} tok/s | tg{a.tg} tok/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['weights']} | {r['mode']} | {r['repacked'] if r['mode'] == 'repack' else '-'} "
              f"| {r['pp_tok_s']:.0f} | {r['tg_tok_s']:.1f} |")
    print("\n| model | verdict | test load alone (s) | warm start: cached verdict (ms) "
          "| Model.load, empty cache (s) | Model.load, verdict cached (s) |\n|---|---|---|---|---|---|")
    for c in costs:
        print(f"| {c['model']} | {c['mode']} | {c['alone_s']:.2f} | {c['warm_ms']:.1f} | {c['first_load_s']:.2f} "
              f"| {c['cached_load_s']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"speeds": rows, "probe": costs, "threads": a.threads, "repeats": a.repeats,
                       "system": system_info().strip()}, f, indent=1)


if __name__ == "__main__":
    main()
