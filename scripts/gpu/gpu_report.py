"""The GPU check's report (gpu_check.py's `report`): everything measured so far, the pass/fail checks, and
gpu_check.json and gpu_check.md."""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpu_common import K_MAX, _load, _save


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
