"""Prompt lookup: localspec's default against llama.cpp's n-gram drafters, same model, prompt and threads (not a test).

Per prompt of the bench's copy-heavy lookup tasks (and open prose), in turn: llama.cpp's
`llama-speculative-simple --spec-type T` for each n-gram kind T at its defaults, then plain decoding and
localspec's default lookup (adaptive; a fresh controller and index per prompt, as a new `localspec run --lookup`
builds them) for as many tokens as the longest llama.cpp run decoded. Greedy. Prints per task the median tok/s
of each, accepted/drafted, and localspec ÷ the best llama.cpp kind, paired prompt by prompt (geometric mean of
the per-prompt ratios, and their min-max).

    python scripts/bench/compare_lookup.py --cpp-bin LLAMA_CPP/build/bin --model gemma3-270m --reps 2
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import time
from typing import Any

from localspec.bench.samples import LOOKUP_PROSE, LOOKUP_TASKS
from localspec.engine.loader import EngineConfig, assemble, load_engine
from localspec.models import LOOKUP
from localspec.speculative.types import NO_DRAFTER

CPP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")


def cpp_run(bin_dir: str, model: str, text: str, n: int, threads: int, spec_type: str,
            extra: tuple[str, ...] = ()) -> dict[str, float] | None:
    """llama-speculative-simple's own report: decoded tokens, tok/s, drafted, accepted (None: it failed)."""
    cmd = [f"{bin_dir}/llama-speculative-simple", "-m", model, "-p", text, "-n", str(n), "--temp", "0",
           "-t", str(threads), "-c", "4096", "-s", "1", "--spec-type", spec_type, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", out)
    if r.returncode or not m:
        print(f"llama.cpp {spec_type} failed ({r.returncode}): {out.strip()[-300:]}")
        return None
    return {"tokens": int(m.group(1)), "tok_s": float(m.group(3)),
            "drafted": int(re.search(r"n_drafted\s*=\s*(\d+)", out).group(1)),
            "accepted": int(re.search(r"n_accept\s*=\s*(\d+)", out).group(1))}


def prompt_text(engine: Any, prompt: str) -> str:
    """The prompt as text, as both programs get it: the chat template's rendering where the model has one."""
    return engine.chat_prompt([{"role": "user", "content": prompt}]) if engine.chat_template else prompt


def cpp_text(engine: Any, prompt: str) -> str:
    """The text llama.cpp gets: it adds BOS itself where the model asks for one, so a template's BOS text goes."""
    text, t = prompt_text(engine, prompt), engine.target
    bos = t.token_text(t.bos) if t.add_bos and t.bos >= 0 else ""
    return text[len(bos):] if bos and text.startswith(bos) else text


def ours(engine: Any, tokens: list[int], n: int, spec: bool) -> dict[str, float]:
    """tok/s of one request from an empty cache: its wall clock less its prefill, as llama.cpp counts."""
    engine.target.rewind(0)
    t0 = time.perf_counter()
    last = None
    for last in engine.generate(tokens, max_tokens=n, speculate=spec):
        pass
    s = last.stats
    wall = time.perf_counter() - t0 - s.prompt_ms / 1e3
    return {"tokens": s.n_generated, "tok_s": s.n_generated / wall, "drafted": s.draft_n,
            "accepted": s.draft_n_accepted}


def gmean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpp-bin", required=True, help="llama.cpp's build/bin with llama-speculative-simple")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tasks", default=",".join([*LOOKUP_TASKS, "prose"]))
    ap.add_argument("--types", default=",".join(CPP_TYPES))
    a = ap.parse_args()
    plain = load_engine(EngineConfig(model=a.model, draft=NO_DRAFTER, threads=a.threads), log=lambda *x: None)
    path = str(plain.target.path)
    tasks = {**LOOKUP_TASKS, "prose": LOOKUP_PROSE}
    print(f"{path}: {a.threads} threads, {a.max_tokens} tokens, greedy, {a.reps} passes")
    for task in a.tasks.split(","):
        res: dict[str, list[dict[str, float]]] = {}
        for _ in range(a.reps):
            for p in tasks[task]:
                cpp = {t: r for t in a.types.split(",")
                       if (r := cpp_run(a.cpp_bin, path, cpp_text(plain, p), a.max_tokens, a.threads, t))}
                n = max([a.max_tokens] + [r["tokens"] for r in cpp.values()])
                tokens = plain.tokenize(prompt_text(plain, p))
                lookup = assemble(EngineConfig(draft=LOOKUP, threads=a.threads), plain.target)  # a fresh run's
                mine = {"plain": ours(plain, tokens, n, False), "localspec lookup": ours(lookup, tokens, n, True)}
                for name, r in {**mine, **{f"llama.cpp {t}": r for t, r in cpp.items()}}.items():
                    res.setdefault(name, []).append(r)
        kinds = [k for k in res if k.startswith("llama.cpp") and len(res[k]) == len(res["plain"])]
        print(f"\n{task}:")
        if kinds:  # the task's best kind (median tok/s), against localspec prompt by prompt
            best = max(kinds, key=lambda k: statistics.median(r["tok_s"] for r in res[k]))
            ratios = [m["tok_s"] / c["tok_s"] for m, c in zip(res["localspec lookup"], res[best])]
            print(f"  localspec ÷ {best}, paired: gmean {gmean(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        for name, rs in res.items():
            tok_s = statistics.median(r["tok_s"] for r in rs)
            acc, dr = sum(r["accepted"] for r in rs), sum(r["drafted"] for r in rs)
            print(f"  {name:26s} {tok_s:6.1f} tok/s  accepted {acc}/{dr}", flush=True)


if __name__ == "__main__":
    main()
