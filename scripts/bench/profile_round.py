"""Where a speculative round's time goes: prompt lookup at a fixed k, greedy, timed part by part (not a test).

Loads the target the way `localspec run --lookup -k K --no-adaptive` does (`load_engine`), then wraps the parts
of a round with perf_counter timers (each wrapper costs ~1 µs, against rounds of 10-30 ms) and decodes every
copy-heavy prompt of the bench's lookup tasks. Per round, in ms:

- llama_decode: the target's verify pass inside llama.cpp (ctypes call included);
- batch fill + view: Model.decode around it (filling llama_batch, the logits view);
- logits: constraints and the argmax of the k+1 rows (loop.constrain_rows, loop.greedy, verify_greedy);
- draft: the drafter's propose (the n-gram index and its match);
- loop rest: the loop's own bookkeeping (controller, truncation, logprobs, Step);
- engine rest: what Engine.generate and the thread controller add per round (text pieces, stats, outcome).

    python scripts/bench/profile_round.py --model gemma3-270m --model smollm2-135m -k 3 -t 2 -n 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any, Callable

import llama_cpp
from compare_lookup import cpp_run, cpp_text, prompt_text  # scripts/: the same llama.cpp run and prompt text

from localspec.bench.samples import LOOKUP_TASKS
from localspec.engine.loader import EngineConfig, load_engine
from localspec.models import LOOKUP
from localspec.speculative import loop

PARTS = ("llama_decode", "batch fill + view", "logits", "draft", "loop rest", "engine rest")


class Timers:
    """Seconds spent in each wrapped function, and how often it ran."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s[name] += time.perf_counter() - t0
                self.n[name] += 1
        return timed

    def reset(self) -> None:
        self.s.clear()
        self.n.clear()


def instrument(engine: Any, timers: Timers) -> None:
    """Wrap the round's parts: llama.cpp's decode, Model.decode, the logits functions the loop imported, the
    drafter, and the generator the loop is (its whole time, to split the loop's rest from the engine's)."""
    llama_cpp.llama_decode = timers.wrap("llama_decode", llama_cpp.llama_decode)
    engine.target.decode = timers.wrap("decode", engine.target.decode)
    for name in ("constrain_rows", "greedy", "verify_greedy"):
        setattr(loop, name, timers.wrap("logits", getattr(loop, name)))
    engine.drafter.propose = timers.wrap("draft", engine.drafter.propose)
    inner = loop.generate

    def generate(*args: Any, **kwargs: Any) -> Any:  # time spent inside the loop's generator, per resume
        gen = inner(*args, **kwargs)
        while True:
            t0 = time.perf_counter()
            try:
                step = next(gen)
            except StopIteration:
                timers.s["loop"] += time.perf_counter() - t0
                return
            timers.s["loop"] += time.perf_counter() - t0
            yield step
    import localspec.engine.engine as engine_module
    engine_module.generate = generate


def cpp_fixed(bin_dir: str, model: str, text: str, k: int, a: argparse.Namespace) -> dict[str, float] | None:
    """llama-speculative-simple with n-gram drafts of exactly k tokens at most: `--spec-draft-n-max` does not cap
    ngram-simple's and ngram-map's drafts (they are `size-m` long, 48 by default), and a key longer than the draft
    drafts nothing, so both are set."""
    extra: tuple[str, ...] = ("--spec-draft-n-max", str(k))
    if a.cpp_type in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        extra += (f"--spec-{a.cpp_type}-size-m", str(k), f"--spec-{a.cpp_type}-size-n", str(min(k, a.cpp_key)))
    return cpp_run(bin_dir, model, text, a.max_tokens, a.threads, a.cpp_type, extra)


def run_prompt(engine: Any, prompt: str, n: int, timers: Timers) -> dict[str, float]:
    """One greedy request from an empty cache; the per-round ms of each part, prefill excluded."""
    engine.target.rewind(0)
    tokens = engine.tokenize(prompt_text(engine, prompt))
    engine.target.decode(tokens[:-1], 0)  # prefill outside the timed part (the loop reuses it)
    timers.reset()
    t0 = time.perf_counter()
    last = None
    for last in engine.generate(tokens, max_tokens=n):
        pass
    wall = time.perf_counter() - t0
    s = last.stats
    rounds = s.rounds
    dec, inner = timers.s["llama_decode"], timers.s["decode"]
    parts = {"llama_decode": dec, "batch fill + view": inner - dec, "logits": timers.s["logits"],
             "draft": timers.s["draft"]}
    parts["loop rest"] = timers.s["loop"] - sum(parts.values())
    parts["engine rest"] = wall - timers.s["loop"]
    out = {k: 1e3 * v / rounds for k, v in parts.items()}
    out.update(rounds=rounds, tokens=s.n_generated, drafted=s.draft_n, accepted=s.draft_n_accepted,
               tok_s=s.n_generated / wall, round_ms=1e3 * wall / rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tasks", default=",".join(LOOKUP_TASKS))
    ap.add_argument("--cpp-bin", help="llama.cpp's build/bin: run llama-speculative-simple beside each prompt")
    ap.add_argument("--cpp-type", default="ngram-simple", help="its --spec-type")
    ap.add_argument("--cpp-key", type=int, default=3, help="its n-gram key length (size-n), at most k")
    a = ap.parse_args()
    for model in a.model or ["gemma3-270m"]:
        engine = load_engine(EngineConfig(model=model, draft=LOOKUP, k=a.k, adaptive=False, threads=a.threads,
                                          lookup_cache=0), log=lambda *x: None)
        timers = Timers()
        instrument(engine, timers)
        print(f"\n{model}: k={a.k}, {a.threads} threads, {a.max_tokens} tokens, n_vocab {engine.target.n_vocab}")
        print("| task | rounds | acc/drafted | tok/s | round ms | " + " | ".join(PARTS) + " |")
        print("|---|---|---|---|---|" + "---|" * len(PARTS))
        for task in a.tasks.split(","):
            rows, cpp, ratios = [], [], []
            for _ in range(a.reps):
                for p in LOOKUP_TASKS[task]:
                    c = cpp_fixed(a.cpp_bin, str(engine.target.path), cpp_text(engine, p), a.k, a) \
                        if a.cpp_bin else None
                    rows.append(run_prompt(engine, p, a.max_tokens, timers))
                    if c:
                        cpp.append(c)
                        ratios.append(rows[-1]["tok_s"] / c["tok_s"])
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            acc, dr = sum(r["accepted"] for r in rows), sum(r["drafted"] for r in rows)
            print(f"| {task} | {med['rounds']:.0f} | {acc}/{dr} | {med['tok_s']:.1f} | {med['round_ms']:.2f} | "
                  + " | ".join(f"{med[p]:.2f}" for p in PARTS) + " |", flush=True)
            if cpp:
                print(f"|   llama.cpp {a.cpp_type} | | {sum(c['accepted'] for c in cpp)}/"
                      f"{sum(c['drafted'] for c in cpp)} | {statistics.median(c['tok_s'] for c in cpp):.1f} | "
                      f"localspec ÷ llama.cpp, paired: median {statistics.median(ratios):.2f} "
                      f"({min(ratios):.2f}-{max(ratios):.2f}) |", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
