"""Plain decoding, greedy and sampled: `localspec run --no-spec` against llama.cpp's llama-server `/completion`
on the same model file, prompt, threads and sampler settings (issue 15; not a test).

Both run interleaved (server, localspec, server, localspec, ...) so drift on the machine hits both alike.
llama-server's number is its own `timings.predicted_per_second`; localspec's is `tokens_per_second` from
`run --json` (generation only, after the first token, like the server's).

Needs llama-server built from the llama.cpp that llama-cpp-python vendors; LLAMA_CPP_BIN points at its bin/.
Usage: LLAMA_CPP_BIN=.../build/bin python scripts/compare_sampling.py [--model gemma3-270m] [--tokens 128]
       [--repeats 5] [--threads 2] [--temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from localspec.bench import tables
from localspec.bench.tasks import builtin_prompts
from localspec.models.resolve import resolve_model

CTX = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


@contextmanager
def llama_server(model: str, threads: int) -> Iterator[str]:
    """llama-server on a free port, one slot; yields its base URL once /health answers."""
    binary = os.path.join(os.environ.get("LLAMA_CPP_BIN", "build/bin"), "llama-server")
    port = free_port()
    proc = subprocess.Popen([binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-c", str(CTX),
                             "-np", "1", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                sys.exit(f"llama-server exited with {proc.returncode}; is LLAMA_CPP_BIN ({binary}) right?")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def server_run(url: str, prompt: str, n: int, sampler: dict, seed: int) -> tuple[float, int]:
    body = {"prompt": prompt, "n_predict": n, "seed": seed, "cache_prompt": False, "repeat_penalty": 1.0, **sampler}
    t = post(url + "/completion", body)["timings"]
    return t["predicted_per_second"], t["predicted_n"]


def localspec_run(model: str, prompt_file: str, n: int, threads: int, sampler: dict, seed: int) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "localspec", "run", "--no-spec", "--json", "-m", model, "--threads", str(threads),
           "--ctx", str(CTX), "-n", str(n), "--prompt-file", prompt_file, "--seed", str(seed),
           "--temp", str(sampler["temperature"]), "--top-k", str(sampler["top_k"]), "--top-p", str(sampler["top_p"]),
           "--min-p", str(sampler["min_p"])]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return out["tokens_per_second"], out["tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m", help="models.toml name or .gguf path (both runtimes load it)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    a = ap.parse_args()
    path = str(resolve_model(a.model, log=lambda *_: None).path)
    prompt = next(p.prompt for p in builtin_prompts() if p.task == "rag")  # a pasted document and a question
    modes = {"greedy": dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0),
             "sampled": dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)}
    res: dict[tuple[str, str], list[tuple[float, int]]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        with llama_server(path, a.threads) as url:
            server_run(url, prompt, 8, modes["greedy"], 0)  # warm-up
            for r in range(a.repeats):
                for mode, sampler in modes.items():
                    res.setdefault(("llama-server", mode), []).append(server_run(url, prompt, a.tokens, sampler, r))
                    res.setdefault(("localspec", mode), []).append(
                        localspec_run(path, f.name, a.tokens, a.threads, sampler, r))
    finally:
        os.unlink(f.name)
    print(f"{os.path.basename(path)}, {a.tokens} tokens, {a.threads} threads, {a.repeats} repeats; "
          f"sampled = T {a.temp}, top-k {a.top_k}, top-p {a.top_p}, min-p {a.min_p}")
    t = tables.grid("", "llama-server tok/s", "localspec tok/s", "ratio", right=[1, 2, 3])
    for mode in modes:
        cols = []
        for who in ("llama-server", "localspec"):
            tps = [x[0] for x in res[(who, mode)]]
            toks = statistics.median(x[1] for x in res[(who, mode)])
            cols.append((statistics.median(tps), f"{statistics.median(tps):6.1f} ({min(tps):.1f}-{max(tps):.1f}) "
                         f"n={toks:.0f}"))
        tables.add(t, mode, cols[0][1], cols[1][1], f"{cols[1][0] / cols[0][0]:.2f}x")
    tables.echo(t)


if __name__ == "__main__":
    main()
