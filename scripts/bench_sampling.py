"""Warp + verify cost per round (issue 15), new sparse path against the old dense one (not a test: speed is
measured here, never asserted).

A round at draft length k: the target's k+1 verify rows are warped and verified; with a model drafter its k
rows are warped one at a time as well (each needs the previous draft). k = 0 is plain decoding: one row warped
and one token drawn. Logits are synthetic with a realistic shape: Gumbel noise (an exponential upper tail, a
handful of clear leaders) at the vocabulary sizes of SmolLM2 (49,152), Qwen (151,936) and Gemma 3 (262,144).
Drafts are drawn from the target's own rows, so most are accepted, as in a good round.

The old implementation (a float64 softmax over the whole vocabulary, then per-row filters with the temperature
first, no penalties) is copied below for the comparison only; the package no longer has it.

With --model, a real run instead: prompt lookup at a fixed k on a pasted document (a RAG prompt), sampled with
the same settings; warp + verify are timed inside the loop and reported as a share of the rounds' time.

Usage: python scripts/bench_sampling.py [--repeats 30] [--vocab 49152 151936 262144] [--k 0 4 8]
       [--temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05 --repeat-penalty 1.0] [--no-old]
       python scripts/bench_sampling.py --model gemma3-270m [--lookup-k 4] [--tokens 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Callable, Sequence

import numpy as np

from localspec.bench import tables
from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import stack, warp
from localspec.speculative.verify import verify

# ---- the old dense implementation (before issue 15), kept here for the comparison ------------------------

def old_warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    logits = np.atleast_2d(logits)
    z = (logits / params.temperature).astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    for row in z:
        _old_filter_row(row, params)
    return z


def _old_filter_row(p: np.ndarray, params: SamplingParams) -> None:
    V = p.shape[0]
    if 0 < params.top_k < V:
        p[np.argpartition(p, V - params.top_k)[: V - params.top_k]] = 0.0
        p /= p.sum()
    if params.top_p < 1.0:
        m = min(1024, V)
        idx = np.argpartition(p, V - m)[V - m:] if m < V else np.arange(V)
        idx = idx[np.argsort(-p[idx], kind="stable")]
        cum = np.cumsum(p[idx])
        if cum[-1] < params.top_p and m < V:
            idx = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[idx])
        mask = np.zeros(V, dtype=bool)
        mask[idx[: int(np.searchsorted(cum, params.top_p) + 1)]] = True
        p[~mask] = 0.0
        p /= p.sum()
    if params.min_p > 0.0:
        p[p < params.min_p * p.max()] = 0.0
        p /= p.sum()


def old_sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    c = np.cumsum(probs)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(probs) - 1))


def old_verify(p: np.ndarray, draft: Sequence[int], q: np.ndarray | None, rng: np.random.Generator) -> int:
    for i, d in enumerate(draft):
        q_d = 1.0 if q is None else q[i, d]
        if q_d <= p[i, d] or rng.random() * q_d < p[i, d]:
            continue
        r = p[i].copy() if q is None else np.maximum(p[i] - q[i], 0.0)
        if q is None:
            r[d] = 0.0
        return old_sample(r if r.sum() > 0 else p[i], rng)
    return old_sample(p[len(draft)], rng)


# ---- rounds ---------------------------------------------------------------------------------------------

def synthetic_logits(rng: np.random.Generator, rows: int, V: int) -> np.ndarray:
    return (rng.gumbel(size=(rows, V)) * 2.5 - 2.0).astype(np.float32)


def new_round(target: np.ndarray, drafter: np.ndarray | None, context: list[int], drafts: list[int],
              params: SamplingParams, rng: np.random.Generator) -> None:
    q = None
    if drafter is not None:  # the drafter warps its rows one at a time, each after the previous draft
        rows = [warp(drafter[i], params, context, drafts[:i]) for i in range(len(drafts))]
        q = stack(rows) if rows else None
    verify(warp(target, params, context, drafts), drafts, q, rng)


def old_round(target: np.ndarray, drafter: np.ndarray | None, context: list[int], drafts: list[int],
              params: SamplingParams, rng: np.random.Generator) -> None:
    q = None
    if drafter is not None and drafts:
        q = np.stack([old_warp(drafter[i], params)[0] for i in range(len(drafts))])
    old_verify(old_warp(target, params), drafts, q, rng)


def time_ms(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def real_share(model: str, k: int, tokens: int, threads: int, params: SamplingParams) -> None:
    """Share of each round spent in warp + verify, timed inside the real loop (lookup drafter, fixed k)."""
    from localspec.backend import LoadOptions, Model
    from localspec.bench.tasks import builtin_prompts
    from localspec.models.resolve import resolve_model
    from localspec.speculative import loop as speculative
    from localspec.speculative.drafters import PromptLookup
    from localspec.tuning.controller import FixedK

    spent = [0.0]

    def timed(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper

    for name in ("warp", "verify", "verify_greedy"):
        setattr(speculative, name, timed(getattr(speculative, name)))
    target = Model.load(resolve_model(model, log=lambda *_: None).path, LoadOptions(n_ctx=4096, n_threads=threads))
    prompt = target.tokenize(next(p.prompt for p in builtin_prompts() if p.task == "rag"))
    for temp_params in (SamplingParams(), params):
        spent[0] = 0.0
        steps = list(speculative.generate(target, prompt, drafter=PromptLookup(), params=temp_params,
                                          controller=FixedK(k), max_tokens=tokens, rng=np.random.default_rng(0)))
        rounds = sum(s.t_draft + s.t_verify for s in steps)  # the prefill is timed apart (Step.t_prompt)
        n = sum(len(s.tokens) for s in steps)
        acc = sum(s.accepted for s in steps) / max(1, sum(s.drafted for s in steps))
        print(f"T={temp_params.temperature}: {len(steps)} rounds, {n} tokens, {n / rounds:.1f} tok/s, acceptance "
              f"{acc:.0%}; warp + verify {spent[0] / rounds:.1%} of the rounds' time "
              f"({1e3 * spent[0] / len(steps):.2f} ms/round)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--vocab", type=int, nargs="+", default=[49_152, 151_936, 262_144])
    ap.add_argument("--k", type=int, nargs="+", default=[0, 4, 8])
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    ap.add_argument("--repeat-penalty", type=float, default=1.0)
    ap.add_argument("--no-old", action="store_true", help="skip the old implementation (slow at large vocabularies)")
    ap.add_argument("--model", help="real run instead: models.toml name or .gguf path")
    ap.add_argument("--tokens", type=int, default=256, help="with --model: tokens to generate")
    ap.add_argument("--lookup-k", type=int, default=4, help="with --model: fixed draft length")
    ap.add_argument("--threads", type=int, default=2, help="with --model: CPU threads")
    a = ap.parse_args(argv)
    params = SamplingParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                            repeat_penalty=a.repeat_penalty)
    if a.model:
        return real_share(a.model, a.lookup_k, a.tokens, a.threads, params)
    rng = np.random.default_rng(0)
    print(f"warp + verify per round, median of {a.repeats} (ms); {params}")
    head = ["vocab", "k", "new lookup", "new model"] + ([] if a.no_old else ["old lookup", "old model", "speedup"])
    t = tables.grid(*head, right=range(len(head)))
    for V in a.vocab:
        for k in a.k:
            target, drafter = synthetic_logits(rng, k + 1, V), synthetic_logits(rng, max(k, 1), V)
            context = rng.integers(0, V, 512).tolist()
            drafts = [warp(target[i], params, context).sample(rng) for i in range(k)]
            new_l = time_ms(lambda: new_round(target, None, context, drafts, params, rng), a.repeats)
            new_m = time_ms(lambda: new_round(target, drafter, context, drafts, params, rng), a.repeats)
            cells = [V, k, f"{new_l:.3f}", f"{new_m:.3f}"]
            if not a.no_old:
                old_l = time_ms(lambda: old_round(target, None, context, drafts, params, rng), a.repeats)
                old_m = time_ms(lambda: old_round(target, drafter, context, drafts, params, rng), a.repeats)
                cells += [f"{old_l:.3f}", f"{old_m:.3f}", f"{old_m / new_m:.1f}x"]
            tables.add(t, *cells)
    tables.echo(t)


if __name__ == "__main__":
    main()
