#!/usr/bin/env python3
"""The checks scripts/gpu/gpu_check.sh runs, and its reports. Run by the venv's Python (localspec installed there).

  note KEY=VALUE..        record a step's facts (build time, pytest exit) in results/steps.json
  env                     model-free: llama.cpp build, GPU offload support, devices       -> results/env.json
  join                    SmolLM2 from the two carried parts, sha256-checked; prints its path
  measure TARGET..        with a real model (SmolLM2) and random-weight targets of real shapes:
                          placement from llama.cpp's log, CPU vs GPU greedy text, --ngl-draft, v(γ) and c by
                          localspec's own calibration, plain tok/s against llama-bench, prompt lookup on the
                          copy-heavy bench tasks, adaptive vs the best fixed γ                -> results/*.json
  costs                   (one subprocess per model) localspec's calibration and every γ timed
  report                  everything measured so far -> OUT/gpu_check.json and OUT/gpu_check.md

Placement is read from llama.cpp's own load log (`localspec run --verbose`, localspec/bench/loadlog.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "The three primary colors are"
# copy-heavy: the answer repeats the prompt (rewrite a block, answer from a pasted document, complete code)
COPY_TASKS = "edit,rag,code"
BENCH_KS = "1,2,4,8,16,auto"
K_MAX = 16
ALPHAS = (0.5, 0.7, 0.8, 0.9, 0.95)


# -- small helpers ---------------------------------------------------------------------------------------------

def _load(p: Path, default=None):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return default


def _save(p: Path, obj) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(p)


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _bin(name: str) -> str:
    """An executable on PATH (gpu_check.sh puts its install's bin first), else beside this Python."""
    found = shutil.which(name)
    return found or str(Path(sys.executable).parent / name)


def _run(cmd: list[str], *, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd if len(cmd) < 30 else cmd[:30] + ["..."]), flush=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    print(f"  exit {p.returncode} in {time.perf_counter() - t0:.1f} s", flush=True)
    if p.returncode:
        print("  " + "\n  ".join((p.stderr or p.stdout).strip().splitlines()[-15:]), flush=True)
    return p


def _threads() -> int:
    return os.cpu_count() or 1


# -- subcommands -----------------------------------------------------------------------------------------------

def cmd_note(a) -> int:
    p = Path(a.results) / "steps.json"
    d = _load(p, {})
    for kv in a.pairs:  # KEY=VALUE sets, KEY?=VALUE sets only if absent (the first build's time, not a resume's)
        k, _, v = kv.partition("=")
        if k.endswith("?"):
            d.setdefault(k[:-1], _value(v))
        else:
            d[k] = _value(v)
    _save(p, d)
    return 0


def cmd_env(a) -> int:
    import llama_cpp

    from localspec.backend import build_info, devices, supports_gpu_offload, system_info

    gpu = a.mode == "cuda"
    d = {"mode": a.mode, "python": sys.version.split()[0], "llama_cpp_python": llama_cpp.__version__,
         "supports_gpu_offload": bool(supports_gpu_offload()), "build_info": build_info(),
         "system_info": system_info().strip(), "devices": devices(), "cpu_count": os.cpu_count()}
    if gpu and shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                            "--format=csv,noheader"], capture_output=True, text=True)
        d["nvidia_smi"] = q.stdout.strip()
    tok = Path(a.results).parents[1] / "bundle1" / "tok.gguf"
    show = _run([_bin("localspec"), "models", "show", "--device", str(tok)])
    d["models_show_device"] = show.stdout if show.returncode == 0 else show.stderr
    gpu_devs = [x for x in d["devices"] if x["type"] in ("GPU", "IGPU") and x["backend"] != "RPC"]  # any backend
    d["checks"] = {"offload support as built": d["supports_gpu_offload"] == gpu,
                   "a GPU device listed" if gpu else "no GPU device listed": bool(gpu_devs) == gpu}
    _save(Path(a.results) / "env.json", d)
    print(json.dumps({k: v for k, v in d.items() if k != "models_show_device"}, indent=1))
    print(d["models_show_device"])
    return 0 if all(d["checks"].values()) else 1


def cmd_join(a) -> int:
    bundles, models = Path(a.bundles), Path(a.models)
    m = _load(bundles / "bundle1" / "manifest.json")["model"]
    out = models / m["name"]
    if not (out.exists() and out.stat().st_size == m["size"]):
        parts = [bundles / "bundle1" / m["parts"][0], bundles / "bundle2" / m["parts"][1]]
        missing = [str(p) for p in parts if not p.exists()]
        if missing:
            sys.exit(f"missing {', '.join(missing)} "
                     "(bundle 1 is gone if the machine was handed back: run phase 1 again)")
        tmp = out.with_suffix(".part")
        with tmp.open("wb") as f:
            for p in parts:
                with p.open("rb") as src:
                    shutil.copyfileobj(src, f, 1 << 22)
        tmp.replace(out)
    h = hashlib.sha256()
    with out.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    if h.hexdigest() != m["sha256"]:
        out.unlink()
        sys.exit(f"{out}: sha256 mismatch after joining the parts")
    print(out)
    return 0


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
        args = [sys.executable, __file__, "costs", "--target", path, "--out", str(f), "--ngl", "-1" if gpu else "0",
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


# -- the report ------------------------------------------------------------------------------------------------

def _f(x, fmt=".2f", none="-"):
    return none if x is None else format(x, fmt)


def _k(k) -> str:
    return "-" if k is None else ("0 (plain)" if k == 0 else str(k))


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def collect(results: Path) -> dict:
    doc = {"schema": "localspec.gpu_check/1", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for name in ("steps", "env", "offload", "costs", "plain_vs_llama_bench", "lookup_bench", "timing"):
        v = _load(results / f"{name}.json")
        if v is not None:
            doc[name] = v
    for name in ("pytest.txt", "pytest_smollm2.txt", "llama_bench_devices.txt"):
        p = results / name
        if p.exists():
            doc[name.replace(".txt", "")] = p.read_text()[-4000:]
    doc["checks"] = checks(doc)
    return doc


def checks(doc: dict) -> dict[str, bool]:
    c: dict[str, bool] = {}
    env = doc.get("env")
    if env:
        c.update(env.get("checks", {}))
    steps = doc.get("steps", {})
    if "pytest_rc" in steps:
        c["tests/test_gpu.py passed"] = steps["pytest_rc"] == 0
    if "pytest_smollm2_rc" in steps:
        c["tests/test_gpu.py with SmolLM2 passed"] = steps["pytest_smollm2_rc"] == 0
    off = doc.get("offload")
    if off and "models" in off:
        for label, m in off["models"].items():
            c[f"{label}: placement (layers, KV cache)"] = bool(m.get("placement_ok"))
            if "agree_tokens" in m:
                c[f"{label}: GPU greedy text agrees with the CPU's for >= 8 tokens"] = \
                    m["agree_tokens"] >= min(8, m["compared_tokens"])
        for ngl_d, d in off.get("draft", {}).items():
            c[f"--ngl-draft {ngl_d}: drafter placement"] = bool(d.get("drafter_ok"))
    costs = doc.get("costs")
    if costs:
        for label, x in costs.items():
            c[f"costs {label}: v(1..{K_MAX}) measured"] = len(x.get("v", {})) == K_MAX
    pvb = doc.get("plain_vs_llama_bench")
    if pvb and "error" not in pvb:
        for label, x in pvb.items():
            c[f"{label}: llama-bench ran"] = x.get("llama_bench", {}).get("tg128_tok_s") is not None
    lb = doc.get("lookup_bench")
    if lb:
        c["lookup bench ran"] = "rows" in lb
    return c


def markdown(doc: dict) -> str:
    env, steps = doc.get("env", {}), doc.get("steps", {})
    mode = env.get("mode") or steps.get("build_mode") or "?"
    out = [f"# localspec GPU check ({mode})", "",
           f"Made by `scripts/gpu/gpu_check.sh` on {doc['created']}. "
           + ("**CPU rehearsal: nothing here was measured on a GPU.**" if mode != "cuda" else ""), ""]
    out += ["## Checks", "", _table(["check", "result"], [[k, "PASS" if v else "**FAIL**"]
                                                          for k, v in doc["checks"].items()]), ""]
    if env:
        out += ["## Build and devices", "",
                f"- llama-cpp-python {env.get('llama_cpp_python')} ({env.get('build_info')}), "
                f"Python {env.get('python')}, "
                f"{env.get('cpu_count')} CPUs; GPU offload: {env.get('supports_gpu_offload')}",
                f"- build: {steps.get('build_seconds', '?')} s at -j{steps.get('build_jobs', '?')}, "
                f"CMAKE_ARGS `{steps.get('cmake_args', '?')}`",
                f"- nvidia-smi: {env.get('nvidia_smi', '-')}",
                f"- devices: {json.dumps(env.get('devices'))}", ""]
    off = doc.get("offload", {})
    if off.get("models"):
        rows = []
        for label, m in off["models"].items():
            ld = m.get("load") or {}
            g, c = m.get("gpu_run") or {}, m.get("cpu_run") or {}
            rows.append([label, Path(m["path"]).name, "PASS" if m.get("placement_ok") else "FAIL",
                         ld.get("offloaded"), ld.get("layer_devices"), ld.get("kv_buffers"), ld.get("model_buffers"),
                         f"{m.get('agree_tokens', '-')}/{m.get('compared_tokens', '-')}",
                         _f(g.get("tokens_per_second"), ".1f"), _f(c.get("tokens_per_second"), ".1f")])
        out += ["## Offload (`localspec run --ngl -1 --verbose`, llama.cpp's load log)", "",
                _table(["model", "file", "placement", "offloaded", "layers", "KV MiB", "model MiB",
                        "greedy agree (tokens)", "GPU tok/s", "CPU tok/s"], rows), ""]
        for label, m in off["models"].items():
            show = m.get("show")
            if isinstance(show, dict):
                keep = {k: show.get(k) for k in ("arch", "params", "quant", "layers", "size", "vocab") if k in show}
                out.append(f"- `models show --json` {label}: {json.dumps(keep) if keep else json.dumps(show)[:300]}")
        out.append("")
        for ngl_d, d in off.get("draft", {}).items():
            r = d.get("run", {})
            out.append(f"- `--draft SmolLM2 --ngl -1 --ngl-draft {ngl_d}`: "
                       f"drafter {'PASS' if d.get('drafter_ok') else 'FAIL'} ({d.get('drafter')}); "
                       f"target {d.get('target')}; {_f(r.get('tokens_per_second'), '.1f')} tok/s, "
                       f"acceptance {_f(r.get('acceptance_rate'))}; same text as plain: {d.get('same_text_as_plain')}")
        out.append("")
    costs = doc.get("costs", {})
    if costs:
        gs = list(range(1, K_MAX + 1))
        rows = []
        for label, x in costs.items():
            if "v" not in x:
                rows.append([label, "error"] + [""] * (K_MAX + 2))
                continue
            rows.append([label, _f(x["t1_ms"])] + [_f(x["v"].get(str(g))) for g in gs]
                        + [", ".join(f"{k} {v:.3f}" for k, v in x["c"].items())])
            cal = x.get("calibration") or {}
            if cal.get("v"):
                rows.append([f"{label} (calibration)", _f(cal.get("t1_ms"))]
                            + [_f(cal["v"].get(str(g))) + ("" if g in (cal.get("timed") or []) else "~") for g in gs]
                            + [", ".join(f"{k} {v:.3f}" for k, v in (cal.get("c") or {}).items())])
        out += ["## Cost curve v(γ) = time of γ+1 verify rows ÷ one row, and c", "",
                "Every γ timed (`costs.measure`, all γ) and, below each, localspec's calibration as `run` uses it "
                "(`~`: interpolated between timed γ). t1: one target row, ms.", "",
                _table(["target", "t1 ms"] + [str(g) for g in gs] + ["c"], rows), ""]
        for label, x in costs.items():
            for src, by_alpha in (x.get("best_gamma") or {}).items():
                out.append(f"- {label}, drafter {src}: best γ by the formula at α = " + ", ".join(
                    f"{al}: γ {b['gamma']} ({b['speedup']:.2f}x)" for al, b in by_alpha.items()))
        out.append("")
    pvb = doc.get("plain_vs_llama_bench", {})
    if pvb and "error" not in pvb:
        rows = [[label, _f(x.get("localspec_tok_s"), ".1f"), _f(x.get("llama_bench", {}).get("tg128_tok_s"), ".1f"),
                 _f(x.get("ratio")),
                 x.get("llama_bench", {}).get("backends", x.get("llama_bench", {}).get("error", "")[:80])]
                for label, x in pvb.items()]
        out += ["## Plain decoding: localspec vs llama-bench (same file, same build)", "",
                _table(["model", "localspec run --no-spec tok/s", "llama-bench tg128 tok/s", "ratio", "backend"],
                       rows), ""]
    lb = doc.get("lookup_bench", {})
    if lb.get("rows"):
        rows = [[r["task"], r["config"], _f(r["tokens_per_second"], ".1f"), _f(r["speedup"]),
                 _f(r["acceptance_rate"]), _f(r["mean_acceptance_length"]), _f(r["v"]), _f(r["c"], ".3f"),
                 _f(r["predicted_speedup"]), _k(r.get("predicted_best_k"))] for r in lb["rows"]]
        out += ["## Prompt lookup on the copy-heavy tasks (SmolLM2-135M, `localspec bench`)", "",
                _table(["task", "config", "tok/s", "spec ÷ plain", "α", "len", "v(γ)", "c", "predicted",
                        "best γ (formula)"], rows), ""]
        rows = [[t, x["best_fixed_k"], _f(x["best_fixed_speedup"]), _f(x["auto_speedup"]), _f(x["auto_mean_gamma"]),
                 _f(x["auto_share_rounds_drafting"]), _k(x.get("predicted_best_k"))] for t, x in lb["adaptive"].items()]
        out += ["Adaptive controller (k=auto) against the best fixed γ:", "",
                _table(["task", "best fixed γ", "its speedup", "auto speedup", "auto mean γ", "rounds drafting",
                        "formula's γ"], rows), "", f"Verdict: {lb.get('verdict')}", ""]
    elif lb.get("error"):
        out += ["## Prompt lookup bench", "", "```", lb["error"][-1500:], "```", ""]
    if doc.get("timing"):
        out += ["Stage times (s): " + ", ".join(f"{k} {v}" for k, v in doc["timing"].items()), ""]
    if doc.get("pytest"):
        out += ["## tests/test_gpu.py", "", "```", doc["pytest"].strip()[-1500:], "```", ""]
    if doc.get("pytest_smollm2"):
        out += ["## tests/test_gpu.py with SmolLM2 (phase 2)", "", "```", doc["pytest_smollm2"].strip()[-2500:],
                "```", ""]
    return "\n".join(out)


def cmd_report(a) -> int:
    doc = collect(Path(a.results))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    _save(out / "gpu_check.json", doc)
    (out / "gpu_check.md").write_text(markdown(doc) + "\n")
    bad = [k for k, v in doc["checks"].items() if not v]
    print(f"report: {out / 'gpu_check.md'}; {len(doc['checks']) - len(bad)}/{len(doc['checks'])} checks pass"
          + (f"; failing: {'; '.join(bad)}" if bad else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("note")
    s.add_argument("--results", required=True)
    s.add_argument("pairs", nargs="*")
    s = sub.add_parser("env")
    s.add_argument("--mode", choices=("cuda", "cpu"), required=True)
    s.add_argument("--results", required=True)
    s = sub.add_parser("join")
    s.add_argument("--bundles", required=True)
    s.add_argument("--models", required=True)
    s = sub.add_parser("measure")
    s.add_argument("--mode", choices=("cuda", "cpu"), required=True)
    s.add_argument("--results", required=True)
    s.add_argument("--smol", required=True)
    s.add_argument("--llama-bench", required=True)
    s.add_argument("--work", required=True)
    s.add_argument("targets", nargs="+")
    s = sub.add_parser("costs")
    s.add_argument("--target", required=True)
    s.add_argument("--draft")
    s.add_argument("--ngl", type=int, default=-1)
    s.add_argument("--k-max", type=int, default=K_MAX)
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--out", required=True)
    s = sub.add_parser("report")
    s.add_argument("--results", required=True)
    s.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    return {"note": cmd_note, "env": cmd_env, "join": cmd_join, "measure": cmd_measure, "costs": cmd_costs,
            "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
