"""Threads on a busy machine (issue 12): localspec's run-time thread choice vs pinned counts vs llama.cpp.

Not a test: speed is measured here, never asserted. Four parts, each printed as a table:

1. decode: plain decoding of the same prompt at the same depth, interleaved (rotated order per repeat), under
   0, 1, 2 CPU-bound background hogs: `localspec run --no-spec` by default (threads chosen at run time), pinned
   to each count (`-t N`), with OMP_WAIT_POLICY=active instead of localspec's default; llama.cpp's llama-bench
   (`-d DEPTH -n TOKENS`) at its default thread count, at each count (its best), and with OMP_WAIT_POLICY=passive.
2. pairs: the same configurations in rotation, and per rotation localspec's default ÷ each (the headline ratios:
   a median of ratios holds when the machine's speed drifts between repeats).
3. trace: one long plain generation; hogs start after `--trace START` seconds and stop DURATION later; prints
   tok/s and the thread count per half second and every change with its reason.
4. start-up: wall time of `localspec run -n 1 hi`, idle vs busy, with a warm calibration cache (after one
   untimed start in the same state, so the entry is complete for it) and an empty one (the calibration cache
   directory is emptied for those runs; it refills itself).

OpenMP's wait policy: compare "localspec default" (libgomp's default: a long spin, then sleep;
localspec/tuning/threads.py) with "..., OMP active" and "..., GOMP_SPINCOUNT=3000" (a short spin), pinned counts
under both, and llama-bench's default with "..., OMP passive", idle and busy.

Needs llama-bench from the llama.cpp that llama-cpp-python vendors; point LLAMA_CPP_BIN at its build/bin (parts
without it still run). Usage (the full run takes ~15 min on 2 cores):
  python scripts/bench_threads.py --tokens 128 --repeats 3 --hogs 0,1,2 --trace 20,2,8
  python scripts/bench_threads.py --tokens 8 --repeats 1 --hogs 0,1 --trace 3,1,1 --startup-repeats 1   # tiny
  python scripts/bench_threads.py --parts pairs --hogs 0,2 --pairs 8   # the paired ratios the claims rest on
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from localspec.backend.machine import cpu_count
from localspec.bench import tables
from localspec.bench.busy import Hogs, busy
from localspec.models.paths import calibration_dir
from localspec.models.resolve import resolve_model
from localspec.tuning.threads import ThreadControl

BIN = os.environ.get("LLAMA_CPP_BIN", "")
# the environment as the user gave it, for every command this script starts
USER_ENV = dict(os.environ)
# a raw completion (greedy, no chat template) that runs on for the whole token budget
PROMPT = "Once upon a time, in a lighthouse on a rocky coast, there lived an old keeper who"


def localspec_run(args: list[str], env: dict | None = None) -> dict:
    """One `localspec run --json`; returns its JSON plus the process wall time."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "localspec", "run", "--json", *args], capture_output=True, text=True,
                       env={**USER_ENV, **(env or {})})
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"localspec run failed: {r.stderr.strip()[-400:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    if not d["tokens"] and "-n" in args and args[args.index("-n") + 1] != "1":
        raise SystemExit(f"localspec run {' '.join(args)} produced no tokens: pick a prompt the model continues")
    d["wall_s"] = wall
    return d


def llama_bench(model: str, tokens: int, depth: int, threads: int | None, env: dict | None = None) -> float:
    """Decode tok/s from llama-bench at `depth` (one repetition; the caller interleaves repeats)."""
    cmd = [f"{BIN}/llama-bench", "-m", model, "-p", "0", "-n", str(tokens), "-d", str(depth), "-r", "1", "-o", "json"]
    if threads:
        cmd += ["-t", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**USER_ENV, **(env or {})})
    if r.returncode:
        raise SystemExit(f"llama-bench failed: {r.stderr.strip()[-400:]}")
    return float(json.loads(r.stdout)[0]["avg_ts"])


def decode_configs(model: str, tokens: int, depth: int, cores: int) -> dict:
    """name -> zero-argument function returning tok/s."""
    base = ["--model", model, "--no-spec", "-n", str(tokens), "--prompt", PROMPT]
    ours = lambda extra=(), env=None: (  # noqa: E731
        lambda: localspec_run([*base, *extra], env)["tokens_per_second"])
    spin = {"GOMP_SPINCOUNT": "3000"}  # a short spin (localspec's default until the CPU meter came)
    cfgs = {"localspec default": ours(), "localspec --mmap": ours(["--mmap"]),  # the weights as llama.cpp maps them
            "localspec default, OMP active": ours(env={"OMP_WAIT_POLICY": "active"}),
            "localspec default, GOMP_SPINCOUNT=3000": ours(env=spin)}
    cfgs |= {f"localspec -t {n}": ours(["-t", str(n)]) for n in range(1, cores + 1)}
    cfgs |= {f"localspec -t {n}, GOMP_SPINCOUNT=3000": ours(["-t", str(n)], spin) for n in range(1, cores + 1)}
    if BIN:
        cfgs["llama-bench default"] = lambda: llama_bench(model, tokens, depth, None)
        cfgs["llama-bench default, OMP passive"] = lambda: llama_bench(model, tokens, depth, None,
                                                                       {"OMP_WAIT_POLICY": "passive"})
        cfgs |= {f"llama-bench -t {n}": (lambda n=n: llama_bench(model, tokens, depth, n)) for n in range(1, cores + 1)}
    return cfgs


def part_decode(model: str, tokens: int, depth: int, hogs: list[int], repeats: int) -> dict:
    cores = cpu_count()
    cfgs = decode_configs(model, tokens, depth, cores)
    names = list(cfgs)
    res: dict[int, dict[str, list[float]]] = {}
    for h in hogs:
        with busy(h):
            time.sleep(0.5)  # let the hogs get going
            for rep in range(repeats):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    res.setdefault(h, {}).setdefault(name, []).append(cfgs[name]())
    print(f"\n## decode: plain, {tokens} tokens at depth {depth}, median tok/s of {repeats} interleaved repeat(s)")
    t = tables.grid("configuration", *(f"{h} hogs" for h in hogs), right=range(1, len(hogs) + 1))
    for name in names:
        tables.add(t, name, *(f"{statistics.median(res[h][name]):.1f}" for h in hogs))
    tables.echo(t)
    for h in hogs:
        med = {n: statistics.median(v) for n, v in res[h].items()}
        best_pin = max(v for n, v in med.items() if n.startswith("localspec -t") and "," not in n)
        line = f"{h} hogs: localspec default = {med['localspec default'] / best_pin:.2f}x its best pinned count"
        if BIN:
            cpp_best = max(v for n, v in med.items() if n.startswith("llama-bench -t"))
            line += (f", {med['localspec default'] / med['llama-bench default']:.2f}x llama-bench default, "
                     f"{med['localspec default'] / cpp_best:.2f}x llama-bench at its best")
        print(line)
    return res


def part_pairs(model: str, tokens: int, depth: int, hogs: list[int], pairs: int) -> None:
    """The headline ratios, paired: `pairs` rotations of localspec's default, each pinned count and llama-bench's
    default, and per rotation default ÷ each other config; the median of those ratios holds when the machine's
    speed drifts between rotations (the decode table's medians of a few repeats move ±5-10 %)."""
    cfgs = decode_configs(model, tokens, depth, cpu_count())
    names = ["localspec default", "localspec --mmap",
             *(n for n in cfgs if n.startswith("localspec -t") and "," not in n)]
    names += ["llama-bench default"] if "llama-bench default" in cfgs else []
    for h in hogs:
        res: dict[str, list[float]] = {n: [] for n in names}
        with busy(h):
            time.sleep(0.5)
            for rep in range(pairs):
                for name in names[rep % len(names):] + names[:rep % len(names)]:
                    res[name].append(cfgs[name]())
        print(f"\n## pairs: {h} hogs, {pairs} rotations, tok/s median and default ÷ config (median of the rotations)")
        t = tables.grid("configuration", "tok/s", "default ÷ it", "rotations (tok/s)", right=[1, 2])
        for name in names:
            ratio = statistics.median(a / b for a, b in zip(res["localspec default"], res[name]))
            tables.add(t, name, f"{statistics.median(res[name]):.1f}", f"{ratio:.3f}", [round(x) for x in res[name]])
        tables.echo(t)


def part_trace(model: str, total: float, start: float, duration: float, n_hogs: int) -> None:
    """One long generation; hogs from `start` to `start + duration` seconds."""
    from localspec.engine.loader import EngineConfig, load_engine

    engine = load_engine(EngineConfig(model=model, draft="none"), log=lambda *a: None)
    prompt = engine.tokenize(PROMPT)
    hogs = Hogs(n_hogs)
    events: list[tuple[float, int, int]] = []  # (t, tokens this round, threads in use)
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < total:
            for chunk in engine.generate(prompt, max_tokens=100000):
                t = time.perf_counter() - t0
                if not hogs.procs and start <= t < start + duration:
                    hogs.start()
                elif hogs.procs and t >= start + duration:
                    hogs.stop()
                events.append((t, len(chunk.step.tokens), engine.threads.state().threads))
                if t >= total or chunk.finish:
                    break
    finally:
        hogs.stop()
    print(f"\n## trace: {n_hogs} hogs from {start:g} s to {start + duration:g} s of a {total:g} s generation")
    t = tables.grid("t (s)", "tok/s", "threads", "", right=[0, 1])
    for b in range(int(total * 2)):
        lo, hi = b / 2, b / 2 + 0.5
        sel = [e for e in events if lo <= e[0] < hi]
        if sel:
            tables.add(t, f"{lo:.1f}", f"{sum(e[1] for e in sel) / 0.5:.1f}", sorted({e[2] for e in sel}),
                       "busy" if start <= lo < start + duration else "")
    tables.echo(t)
    for c in engine.threads.state().changes:
        print(f"change at {c.at_s:6.2f} s ({c.phase}): {c.old} -> {c.new}: {c.reason}")
    engine.close()


def settle(cal_dir: Path, busy: bool, most: int = 4) -> None:
    """Start until the calibration cache is complete for the machine as it is now (at most `most` starts): a
    first start may leave stages for the next ones, and an entry timed busy is timed again on a quiet start."""
    for _ in range(most):
        localspec_run(["-n", "1", "hi"])
        entries = [json.loads(f.read_text())["calibration"] for f in cal_dir.glob("*.json")]
        if entries and all(e["complete"] and (busy or (e.get("others") or 0) < ThreadControl.BUSY_AT)
                           for e in entries):
            return


def part_startup(repeats: int, n_hogs: int) -> None:
    """`localspec run -n 1 hi` wall time: idle/busy x warm/empty calibration cache."""
    cal_dir = calibration_dir()
    rows: dict[str, list[float]] = {}
    localspec_run(["-n", "1", "hi"])  # fetch the model and warm the cache once
    for _ in range(repeats):
        for h in (0, n_hogs):
            with busy(h):
                for cache in ("warm", "empty"):
                    if cache == "empty":
                        shutil.rmtree(cal_dir, ignore_errors=True)
                    else:  # settle: a start may leave a stage for the next, and an entry measured under
                        settle(cal_dir, busy=h > 0)  # another load is re-timed: "warm" = complete for this load
                    rows.setdefault(f"{h} hogs, {cache} cache", []).append(localspec_run(["-n", "1", "hi"])["wall_s"])
    print(f"\n## start-up: `localspec run -n 1 hi` wall seconds, median of {repeats}")
    t = tables.grid("machine and calibration cache", "wall s", right=[1])
    for name, v in rows.items():
        tables.add(t, name, f"{statistics.median(v):.2f}")
    tables.echo(t)
    w0, wb = statistics.median(rows["0 hogs, warm cache"]), statistics.median(rows[f"{n_hogs} hogs, warm cache"])
    print(f"busy/idle with a warm cache: {wb / w0:.2f}x")


def prompt_depth(model: str) -> int:
    from localspec.backend import LoadOptions, Model

    m = Model.load(model, LoadOptions(n_ctx=512))
    try:
        return len(m.tokenize(PROMPT))
    finally:
        m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded SmolLM2-135M Q4_1)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hogs", default="0,1,2", help="background hog counts for the decode table")
    ap.add_argument("--trace", default="20,2,8", help="TOTAL,START,DURATION seconds (empty: skip)")
    ap.add_argument("--trace-hogs", type=int, default=2)
    ap.add_argument("--startup-repeats", type=int, default=3, help="0: skip the start-up part")
    ap.add_argument("--parts", default="decode,trace,startup", help="any of decode,pairs,trace,startup")
    ap.add_argument("--pairs", type=int, default=8, help="rotations for the pairs part")
    a = ap.parse_args()
    model = str(Path(a.model) if a.model else resolve_model(None, log=lambda *x: None).path)
    parts = set(a.parts.split(","))
    print(f"# bench_threads: {model}, {cpu_count()} cores, llama-bench: {BIN or 'not found (set LLAMA_CPP_BIN)'}")
    if "decode" in parts:
        part_decode(model, a.tokens, prompt_depth(model), [int(h) for h in a.hogs.split(",")], a.repeats)
    if "pairs" in parts:
        part_pairs(model, a.tokens, prompt_depth(model), [int(h) for h in a.hogs.split(",")], a.pairs)
    if "trace" in parts and a.trace:
        total, start, duration = (float(x) for x in a.trace.split(","))
        part_trace(model, total, start, duration, a.trace_hogs)
    if "startup" in parts and a.startup_repeats:
        part_startup(a.startup_repeats, a.trace_hogs)


if __name__ == "__main__":
    main()
