"""The GPU check's measurements with real models (gpu_check.py's `measure` and `costs`): placement, CPU vs
GPU text, v(γ) and c, plain tok/s against llama-bench, prompt lookup and adaptive γ on the bench tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpu_common import ALPHAS, BENCH_KS, COPY_TASKS, K_MAX, PROMPT, _bin, _load, _run, _save, _threads

CHECK = Path(__file__).with_name("gpu_check.py")  # `costs` runs through it, one process per model


def _tokens(path: str, texts: list[str]) -> list[list[int]]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    try:
        return [llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
    finally:
        llm.close()


def _localspec_run(model: str, args: list[str], n: int = 64) -> tuple[dict | None, str, int]:
    p = _run([_bin("localspec"), "run", "--model", model, "--json", "-n", str(n), "--ctx", "2048", *args, PROMPT])
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    except (ValueError, IndexError):
        out = None
    return out, p.stderr, p.returncode


_RUN_KEYS = ("text", "tokens", "model", "drafter", "mode", "k", "tokens_per_second", "ttft_ms", "acceptance_rate",
             "draft_n", "draft_n_accepted", "v", "c", "threads", "finish_reason")


def offload_checks(models: dict[str, str], smol: str, target: str, gpu: bool, work: Path) -> dict:
    """Placement, CPU vs GPU greedy text, and the drafter's placement with --ngl-draft."""
    from localspec.bench.loadlog import parse_load_log, placement_ok
    from localspec.speculative.drafters import common_prefix

    res: dict = {"models": {}, "draft": {}}
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    for label, path in models.items():
        show = _run([_bin("localspec"), "models", "show", "--json", path])
        gpu_run, gpu_log, rc1 = _localspec_run(path, ["--no-spec", "--ngl", "-1", "--verbose", "-t", str(_threads())])
        cpu_run, _, rc2 = _localspec_run(path, ["--no-spec", "--ngl", "0", "-t", str(_threads())])
        (logs / f"{label}-ngl-1.log").write_text(gpu_log)
        loads = [x for x in parse_load_log(gpu_log) if Path(x["path"]).name == Path(path).name]
        ok, how = placement_ok(loads[0], gpu) if loads else (False, "no load in llama.cpp's log")
        entry = {"path": path, "show": _json_or(show.stdout), "load": loads[0] if loads else None,
                 "placement_ok": ok, "placement": how,
                 "gpu_run": {k: gpu_run.get(k) for k in _RUN_KEYS} if gpu_run else {"error": gpu_log[-2000:]},
                 "cpu_run": {k: cpu_run.get(k) for k in _RUN_KEYS} if cpu_run else None}
        if gpu_run and cpu_run:
            ta, tb = _tokens(path, [gpu_run["text"], cpu_run["text"]])
            entry["agree_tokens"] = common_prefix(ta, tb)
            entry["compared_tokens"] = min(len(ta), len(tb))
            entry["same_text"] = gpu_run["text"] == cpu_run["text"]
        res["models"][label] = entry
    # the drafter: --ngl-draft -1 puts it on the GPU too; --ngl-draft 0 keeps it on the CPU
    for ngl_d in ("-1", "0"):
        out, log, rc = _localspec_run(target, ["--draft", smol, "--ngl", "-1", "--ngl-draft", ngl_d, "--verbose",
                                               "-k", "4", "--no-adaptive", "-t", str(_threads())])
        (logs / f"draft-ngl-draft{ngl_d}.log").write_text(log)
        loads = parse_load_log(log)
        d_load = next((x for x in loads if Path(x["path"]).name == Path(smol).name), None)
        t_load = next((x for x in loads if Path(x["path"]).name == Path(target).name), None)
        d_ok = placement_ok(d_load, gpu and ngl_d == "-1") if d_load else (False, "no drafter load in the log")
        t_ok = placement_ok(t_load, gpu) if t_load else (False, "no target load in the log")
        plain = res["models"].get("target", {}).get("gpu_run", {})
        res["draft"][ngl_d] = {"drafter_ok": d_ok[0], "drafter": d_ok[1], "target_ok": t_ok[0], "target": t_ok[1],
                               "run": {k: out.get(k) for k in _RUN_KEYS} if out else {"error": log[-2000:]},
                               "same_text_as_plain": bool(out and plain.get("text") == out.get("text"))}
    return res


def _json_or(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_costs(a) -> int:
    """localspec's calibration (what `run` uses: timed_gammas, cached per machine) and every γ 1..K timed, for one
    target (+ drafter). Runs in its own process: one model set in GPU memory at a time."""
    from localspec.backend import LoadOptions, Model
    from localspec.bench.theory import best_gamma
    from localspec.tuning import calibration, costs

    opts = LoadOptions(n_ctx=2048, n_gpu_layers=a.ngl)
    target = Model.load(a.target, opts)
    draft = Model.load(a.draft, opts) if a.draft else None
    t0 = time.perf_counter()
    cal = calibration.calibrate(target, k_max=a.k_max, draft_model=draft, use_cache=False)
    t_cal = time.perf_counter() - t0
    toks = costs.probe_tokens(target, calibration.V_DEPTH + a.k_max + 1)
    every = lambda k: list(range(k + 1))  # noqa: E731
    orig, costs.timed_gammas = costs.timed_gammas, every
    try:
        t0 = time.perf_counter()
        full = costs.measure(target, toks, a.k_max, drafters={"model": draft} if draft else None, lookup=True,
                             repeats=a.repeats)
        t_full = time.perf_counter() - t0
    finally:
        costs.timed_gammas = orig
    v = full.v_by_gamma
    pred = {}
    for src, c in full.c.items():
        pred[src] = {str(al): dict(zip(("gamma", "speedup"), best_gamma(al, c, v))) for al in ALPHAS}
    out = {"target": a.target, "draft": a.draft, "ngl": a.ngl, "t1_ms": full.t_target_ms, "v": v,
           "c": full.c, "position": full.position, "seconds": round(t_full, 2),
           "calibration": {"v": cal.costs.v_by_gamma if cal.costs else None,
                           "timed": list(cal.costs.timed) if cal.costs else None,
                           "t1_ms": cal.costs.t_target_ms if cal.costs else None,
                           "c": cal.costs.c if cal.costs else None,
                           "flash_attn": cal.flash_attn, "threads": cal.threads, "seconds": round(t_cal, 2)},
           "best_gamma": pred}
    for m in (draft, target):
        if m is not None:
            m.close()
    _save(Path(a.out), out)
    print(f"t1 {full.t_target_ms:.2f} ms; v: " + " ".join(f"{g}:{x:.2f}" for g, x in v.items()) + f"; c {full.c}")
    return 0


def llama_bench(binary: str, path: str, gpu: bool) -> dict:
    lib = Path(__import__("llama_cpp").__file__).parent / "lib"
    cmd = [binary, "-m", path, "-p", "0", "-n", "128", "-r", "3", "-o", "json",
           "-ngl", "99" if gpu else "0", "-t", str(_threads())]
    p = _run(cmd, env={"LD_LIBRARY_PATH": str(lib)})
    rows = _json_or(p.stdout) if p.returncode == 0 else None
    if not isinstance(rows, list) or not rows:
        return {"error": (p.stderr or p.stdout)[-2000:]}
    r = rows[-1]
    return {"tg128_tok_s": r.get("avg_ts"), "stddev": r.get("stddev_ts"), "n_gpu_layers": r.get("n_gpu_layers"),
            "flash_attn": r.get("flash_attn"), "backends": r.get("backends"), "gpu_info": r.get("gpu_info"),
            "build_commit": r.get("build_commit"), "n_threads": r.get("n_threads")}


def plain_vs_bench(models: dict[str, str], binary: str, gpu: bool) -> dict:
    out = {}
    for label, path in models.items():
        run, log, rc = _localspec_run(path, ["--no-spec", "--ngl", "-1" if gpu else "0"], n=128)
        out[label] = {"localspec_tok_s": run.get("tokens_per_second") if run else None,
                      "localspec_tokens": run.get("tokens") if run else None,
                      "llama_bench": llama_bench(binary, path, gpu)}
        lb = out[label]["llama_bench"].get("tg128_tok_s")
        if lb and out[label]["localspec_tok_s"]:
            out[label]["ratio"] = out[label]["localspec_tok_s"] / lb
    return out


# bench on the GPU: `localspec bench` loads every model with LoadOptions(n_ctx, n_threads) (no --ngl: on the CPU);
# the check gives its loads n_gpu_layers in this process only
_BENCH = ("import functools, sys; import localspec.bench.runner as r; from localspec.backend import LoadOptions; "
          "r.LoadOptions = functools.partial(LoadOptions, n_gpu_layers=int(sys.argv.pop(1))); "
          "import runpy; sys.argv[0] = 'localspec'; runpy.run_module('localspec', run_name='__main__')")


def lookup_bench(smol: str, gpu: bool, results: Path, quick: bool) -> dict:
    js, md = results / "bench.json", results / "bench.md"
    args = ["bench", "--model", smol, "--lookup", "--tasks", COPY_TASKS, "--k", BENCH_KS, "--json", str(js),
            "--markdown", str(md),
            "--note", f"scripts/gpu/gpu_check.py on {'the GPU (all layers offloaded)' if gpu else 'the CPU'}"]
    if quick:
        args += ["--per-task", "1", "-n", "64"]
    p = _run([sys.executable, "-c", _BENCH, "-1" if gpu else "0", *args], timeout=900)
    if p.returncode:
        return {"error": (p.stderr or p.stdout)[-3000:]}
    return summarize_bench(_load(js))


def summarize_bench(doc: dict) -> dict:
    """Per task (and all): each configuration's measured speedup, α, γ, the formula's prediction; the adaptive
    controller's mean drafted length and speedup against the best fixed γ."""
    from localspec.bench.theory import best_gamma

    rows = [r for r in doc["results"] if r["temp"] == 0]
    runs = doc.get("runs", [])
    costs = (doc.get("targets") or [{}])[0].get("costs") or {}
    v = {int(g): x for g, x in (costs.get("v") or {}).items()}
    c_lookup = (costs.get("c") or {}).get("lookup", 0.0)
    out: dict = {"rows": [], "adaptive": {}}
    for r in rows:
        row = {k: r.get(k) for k in ("task", "config", "k", "tokens_per_second", "speedup", "acceptance_rate",
                                     "mean_acceptance_length", "v", "c", "predicted_speedup", "predicted_best_k")}
        if row["predicted_best_k"] is None and v and r["drafter"] not in ("none", "plain"):
            # the γ the formula picks at this row's α, from the bench's own v(γ) and c (localspec/bench/theory.py)
            row["predicted_best_k"] = best_gamma(min(1.0, max(0.0, r["acceptance_rate"])), c_lookup, v)[0]
        out["rows"].append(row)
    for task in dict.fromkeys(r["task"] for r in rows):
        spec = [r for r in rows if r["task"] == task and r["drafter"] != "none" and r["drafter"] != "plain"]
        fixed = [r for r in spec if r["k"] != "auto"]
        auto = next((r for r in spec if r["k"] == "auto"), None)
        if not fixed:
            continue
        best = max(fixed, key=lambda r: r["speedup"])
        a_runs = [x for x in runs if x["k"] == "auto" and (task == "all" or x["task"] == task)]
        with_draft = sum(sum(x["accept_hist"]) for x in a_runs)
        out["adaptive"][task] = {
            "best_fixed_k": best["k"], "best_fixed_speedup": best["speedup"],
            "auto_speedup": auto["speedup"] if auto else None,
            "auto_mean_gamma": (sum(x["draft_n"] for x in a_runs) / with_draft) if with_draft else None,
            "auto_share_rounds_drafting": (with_draft / sum(x["rounds"] for x in a_runs)) if a_runs else None,
            "predicted_best_k": best_gamma(min(1.0, max(0.0, best["acceptance_rate"])), c_lookup, v)[0] if v else None}
    out["verdict"] = doc.get("verdict")
    return out


def cmd_measure(a) -> int:
    gpu = a.mode == "cuda"
    results, work = Path(a.results), Path(a.work)
    smol, targets = a.smol, a.targets
    big = targets[0]
    t0 = time.perf_counter()
    timing = _load(results / "timing.json", {})

    def stage(name: str, fn):
        t = time.perf_counter()
        print(f"\n-- {name}", flush=True)
        try:
            val = fn()
        except Exception as e:  # one stage failing still leaves the others' results
            val = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {name} failed: {val['error']}", flush=True)
        timing[name] = round(time.perf_counter() - t, 1)
        _save(results / "timing.json", timing)
        return val

    models = {"smollm2": smol, "target": big}
    off = stage("offload", lambda: offload_checks(models, smol, big, gpu, work))
    _save(results / "offload.json", off)
    costs = {}
    for label, path, draft in [("smollm2", smol, None)] + [(Path(t).stem, t, smol) for t in targets]:
        f = results / f"costs-{label}.json"
        args = [sys.executable, str(CHECK), "costs", "--target", path, "--out", str(f), "--ngl", "-1" if gpu else "0",
                "--k-max", str(K_MAX)] + (["--draft", draft] if draft else [])
        p = stage(f"costs {label}", lambda: _run(args, timeout=900))
        ok = isinstance(p, subprocess.CompletedProcess) and p.returncode == 0
        costs[label] = _load(f) if ok else {"error": "see log"}
    _save(results / "costs.json", costs)
    all_models = {"smollm2": smol, **{Path(t).stem: t for t in targets}}
    pvb = stage("plain vs llama-bench", lambda: plain_vs_bench(all_models, a.llama_bench, gpu))
    _save(results / "plain_vs_llama_bench.json", pvb)
    quick = not gpu or bool(os.environ.get("GPU_CHECK_QUICK"))  # one prompt per task, 64 tokens
    lb = stage("lookup bench", lambda: lookup_bench(smol, gpu, results, quick=quick))
    _save(results / "lookup_bench.json", lb)
    print(f"\nmeasure: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0
