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
from pathlib import Path

from gpu_common import K_MAX, _bin, _load, _run, _save, _value
from gpu_measure import cmd_costs, cmd_measure
from gpu_report import cmd_report

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
