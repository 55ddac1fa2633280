"""Engine benchmark for the closing note of the engine issue (not a test: speed is measured, never asserted).

Compares, on the same prompts and threads, interleaved round-robin to cancel machine drift:
  1. plain decoding: localspec (--no-spec path) vs llama-cpp-python's own `Llama(...)(prompt, temperature=0)`;
  2. model drafter on the F16-target / Q4_1-drafter SmolLM2 pair for k = 2, 4, 6 (and plain F16 as baseline);
  3. prompt lookup vs plain on a code-rewrite prompt.

Usage: python scripts/bench_engine.py [--tokens 128] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from localspec.backend import LoadOptions, Model
from localspec.bench import tables
from localspec.bench.samples import PROSE, REWRITE, REWRITE_START
from localspec.engine.engine import Engine
from localspec.models.gguf_tools import write_dequantized
from localspec.models.paths import cache_dir
from localspec.models.resolve import resolve_model
from localspec.speculative.drafters import ModelDrafter, PromptLookup
from localspec.tuning.controller import FixedK


def chat(engine: Engine, text: str) -> list[int]:
    return engine.tokenize(engine.chat_prompt([{"role": "user", "content": text}]))


def timed(engine: Engine, prompt: list[int], n: int, *, spec: bool) -> tuple[float, float, int]:
    """(tokens/s of generation, acceptance, tokens) for one request; the prompt cache is cleared first."""
    engine.target.rewind(0)
    if engine.drafter is not None and hasattr(engine.drafter, "model"):
        engine.drafter.model.rewind(0)
    last = None
    for last in engine.generate(prompt, max_tokens=n, spec=spec):
        pass
    s = last.stats
    return s.tokens_per_second, s.acceptance_rate, s.n_generated


def llama_cpp_plain(path: Path, prompts: list[str], n: int, threads: int):
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)

    def run(text: str) -> tuple[float, int]:
        llm.reset()
        msgs = [{"role": "user", "content": text}]
        first = None
        count = 0
        for _ in llm.create_chat_completion(msgs, temperature=0.0, max_tokens=n, stream=True):
            count += 1
            if first is None:
                first = time.perf_counter()
        t1 = time.perf_counter()
        return (count - 1) / (t1 - first) if count > 1 else 0.0, count

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    q4 = resolve_model(None).path
    f16 = cache_dir() / "fixtures" / "SmolLM2-135M-Instruct.F16.gguf"
    if not f16.exists():
        write_dequantized(q4, f16)
    opts = LoadOptions(n_ctx=2048, n_threads=a.threads)

    print(f"# plain decoding, SmolLM2-135M Q4_1, {a.tokens} tokens, {a.threads} threads, {a.repeats} repeats")
    q4_model = Model.load(q4, opts)
    plain = Engine(q4_model, None)
    ref = llama_cpp_plain(q4, PROSE, a.tokens, a.threads)
    ours, theirs = [], []
    for _ in range(a.repeats):
        for p in PROSE:
            ours.append(timed(plain, chat(plain, p), a.tokens, spec=False)[0])
            theirs.append(ref(p)[0])
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(f"localspec --no-spec: {mo:.1f} tok/s | llama-cpp-python Llama(): {mt:.1f} tok/s | ratio {mo / mt:.3f}")

    print("\n# lookup on a code-rewrite prompt (SmolLM2-135M Q4_1)")
    look = Engine(q4_model, PromptLookup(), controller=FixedK(6))
    rows = {"plain": [], "lookup k=6": []}
    acc = []
    prompt = look.tokenize(look.chat_prompt([{"role": "user", "content": REWRITE}]) + REWRITE_START)
    for _ in range(a.repeats):
        rows["plain"].append(timed(look, prompt, a.tokens, spec=False)[0])
        tps, ac, _ = timed(look, prompt, a.tokens, spec=True)
        rows["lookup k=6"].append(tps)
        acc.append(ac)
    base = statistics.median(rows["plain"])
    t = tables.grid("config", "tok/s", "vs plain", right=[1, 2])
    for name, v in rows.items():
        tables.add(t, name, f"{statistics.median(v):.1f}", f"{statistics.median(v) / base:.2f}x")
    tables.echo(t)
    print(f"lookup acceptance {statistics.median(acc):.2f}")

    print("\n# model drafter: target SmolLM2 F16, drafter SmolLM2 Q4_1 (same tokenizer)")
    target = Model.load(f16, opts)
    drafter = ModelDrafter(Model.load(q4, opts))
    eng = Engine(target, drafter, controller=FixedK(4))
    prompts = [chat(eng, p) for p in PROSE]
    res: dict[str, list[float]] = {"plain F16": []}
    accs: dict[str, list[float]] = {}
    for _ in range(a.repeats):
        for p in prompts:
            res["plain F16"].append(timed(eng, p, a.tokens, spec=False)[0])
            for k in (2, 4, 6):
                eng.controller = FixedK(k)
                tps, ac, _ = timed(eng, p, a.tokens, spec=True)
                res.setdefault(f"k={k}", []).append(tps)
                accs.setdefault(f"k={k}", []).append(ac)
    base = statistics.median(res["plain F16"])
    t = tables.grid("config", "tok/s", "vs plain", "acceptance", right=[1, 2, 3])
    for name, v in res.items():
        acc_k = f"{statistics.median(accs[name]):.2f}" if name in accs else "-"
        tables.add(t, name, f"{statistics.median(v):.1f}", f"{statistics.median(v) / base:.2f}x", acc_k)
    tables.echo(t)


if __name__ == "__main__":
    main()
