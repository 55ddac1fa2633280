"""localspec vs llama.cpp's own C++ binaries on the same models, prompts, threads (not a test).

Needs `llama-speculative` and `llama-bench` built from the llama.cpp that llama-cpp-python vendors (its sdist's
vendor/llama.cpp: `cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-speculative llama-bench`);
point LLAMA_CPP_BIN at build/bin. Usage: python scripts/compare_llamacpp.py [TARGET.gguf]
(default target: the F16 copy of SmolLM2 that tests/conftest.py writes; drafter: SmolLM2 Q4_1).
"""
import os
import re
import statistics
import subprocess
import sys
import time

from localspec.backend import LoadOptions, Model
from localspec.bench import tables
from localspec.bench.samples import PROSE
from localspec.engine.engine import Engine
from localspec.models.paths import cache_dir
from localspec.models.resolve import resolve_model
from localspec.speculative.drafters import ModelDrafter
from localspec.tuning.controller import FixedK

BIN = os.environ.get("LLAMA_CPP_BIN", "build/bin")
Q4 = str(resolve_model(None, log=lambda *a: None).path)
TGT = sys.argv[1] if len(sys.argv) > 1 else str(cache_dir() / "fixtures" / "SmolLM2-135M-Instruct.F16.gguf")
N, K, REPS = 128, 4, 3


def cpp_spec(prompt):
    r = subprocess.run([f"{BIN}/llama-speculative", "-m", TGT, "-md", Q4, "-p", prompt, "-n", str(N),
                        "--spec-draft-n-max", str(K), "--temp", "0", "-t", "2", "-td", "2", "-c", "2048", "-s", "1",
                        "--ignore-eos"], capture_output=True, text=True)
    out = r.stdout + r.stderr
    speed = float(re.search(r"decoded\s+\d+\s+tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out).group(1))
    acc = float(re.search(r"accept\s*=\s*([\d.]+)%", out).group(1)) / 100
    return speed, acc


def cpp_plain(path):
    r = subprocess.run([f"{BIN}/llama-bench", "-m", path, "-p", "0", "-n", str(N), "-t", "2", "-r", "3", "-o", "csv"],
                       capture_output=True, text=True)
    line = [row for row in r.stdout.splitlines() if row.strip()][-1]
    return float(line.split(",")[-2].strip('"'))


t = Model.load(TGT, LoadOptions(n_ctx=2048, n_threads=2))
d = ModelDrafter(Model.load(Q4, LoadOptions(n_ctx=2048, n_threads=2)))
eng = Engine(t, d, controller=FixedK(K))
plain_q4 = Engine(Model.load(Q4, LoadOptions(n_ctx=2048, n_threads=2)), None)


def ours(engine, prompt, spec):
    """Wall-clock decode speed after the first round (llama-speculative times from its first decode)."""
    engine.target.rewind(0)
    if engine.drafter:
        engine.drafter.model.rewind(0)
    last = first = None
    n0 = 0
    for last in engine.generate(prompt, max_tokens=N, spec=spec):
        if first is None:
            first, n0 = time.perf_counter(), last.stats.n_generated
    t1 = time.perf_counter()
    return (last.stats.n_generated - n0) / (t1 - first), last.stats.acceptance_rate



res = {}
for _ in range(REPS):
    for p in PROSE:
        prompt = eng.chat_prompt([{"role": "user", "content": p}])
        res.setdefault("cpp spec", []).append(cpp_spec(prompt))
        res.setdefault("ours spec", []).append(ours(eng, prompt, True))
        res.setdefault("ours plain (target)", []).append(ours(eng, prompt, False))
        res.setdefault("ours plain Q4_1", []).append(ours(plain_q4, prompt, False))
table = tables.grid("config", "tok/s", "acceptance", right=[1, 2])
for name, v in res.items():
    tps, acc = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
    tables.add(table, name, f"{tps:.1f}", f"{acc:.2f}")
tables.echo(table)
print(f"llama-bench tg{N} target: {cpp_plain(TGT):.1f} tok/s ; Q4_1: {cpp_plain(Q4):.1f} tok/s")
