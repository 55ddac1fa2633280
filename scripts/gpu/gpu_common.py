"""What the GPU check's subcommands share (gpu_check.py): the prompt and bench settings, JSON files, and
running a command with its exit status and time printed."""

from __future__ import annotations

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
