"""What a verify round of n rows costs against one plain step, with logits for every row (what greedy or sampled
verification needs) and for the last row only (a prefill): the difference is the output layer's share.

Speculation pays only while scoring γ+1 rows costs little more than one. On a 2-core CPU a small model's
single-token step is already compute-bound, so rows cost nearly their number, and a large vocabulary makes each
row's logits dear (Gemma-3-270M: 262,144 × 640 output weights, more than the rest of the model):

    python scripts/verify_rows.py MODEL.gguf [--rows 1,2,4,8,16,32,64] [--depth 512] [--threads 2]

With several files (one model in several quantizations), they are timed in turn, repeat by repeat, so every
file sees the same moment of the machine, and the table gives each file's step and what each row of a verify
round adds, in milliseconds: what a quantization with a batched CPU kernel saves (model_facts.ROW_BY_ROW).

    python scripts/verify_rows.py Q4_1.gguf Q4_0.gguf Q4_K_M.gguf --rows 1,8,16,32
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from localspec.backend import LoadOptions, Model


def timed(model: Model, base: int, tokens: list[int], rows: int) -> float:
    """Seconds of one decode of `tokens` after `base` cached positions (rewound after)."""
    model.rewind(base)
    t0 = time.perf_counter()
    model.decode(tokens, rows)
    t = time.perf_counter() - t0
    model.rewind(base)
    return t


def ratios(model: Model, base: int, tokens: list[int], repeats: int) -> tuple[float, float, float]:
    """(one step s, every row ÷ one step, last row ÷ one step): the three timed in turn, fastest of each, so
    all three see the same moment of a machine whose speed drifts."""
    one, every, last = [], [], []
    for _ in range(repeats):
        one.append(timed(model, base, tokens[:1], 1))
        every.append(timed(model, base, tokens, len(tokens)))
        last.append(timed(model, base, tokens, 1))
    return min(one), min(every) / min(one), min(last) / min(one)


def compare(models: dict[str, Model], depth: int, follow: list[int], rows: list[int], repeats: int) -> None:
    """Per row count, each file's fastest one step and n-row round (every row's logits), timed in turn."""
    print("| rows | " + " | ".join(f"{name}: ms (× its step), ms a row after the first" for name in models) + " |")
    print("|---|" + "---|" * len(models))
    for r in rows:
        best: dict[str, list[float]] = {name: [float("inf")] * 2 for name in models}
        for _ in range(repeats):
            for name, m in models.items():
                b = best[name]
                b[0] = min(b[0], timed(m, depth, follow[:1], 1))
                b[1] = min(b[1], timed(m, depth, follow[:r], r))
        cells = [f"{1e3 * t:.1f} ({t / t1:.2f}×), {1e3 * (t - t1) / max(r - 1, 1):.2f}" for t1, t in best.values()]
        print(f"| {r} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="+", help="GGUF file(s); several: timed in turn, side by side")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--depth", type=int, default=512, help="cached positions before the timed rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    opts = LoadOptions(n_ctx=a.depth + max(rows) + 16, n_threads=a.threads)
    models = {Path(p).name: Model.load(p, opts) for p in a.model}
    n = min(m.n_vocab for m in models.values())
    for m in models.values():
        m.decode([(17 * i + 5) % n for i in range(a.depth)], 1)
    follow = [(31 * i + 7) % n for i in range(max(rows))]
    print(f"{a.threads} threads, depth {a.depth}")
    if len(models) > 1:
        compare(models, a.depth, follow, rows, a.repeats)
        for m in models.values():
            m.close()
        return
    model = next(iter(models.values()))
    print("| rows | one step (ms) | logits for every row (× one step) | for the last row only | output layer |")
    print("|---|---|---|---|---|")
    for r in rows:
        t1, every, last = ratios(model, a.depth, follow[:r], a.repeats)
        print(f"| {r} | {1e3 * t1:.2f} | {every:.2f} | {last:.2f} | {100 * (1 - last / every):.0f} % |")
    model.close()


if __name__ == "__main__":
    main()
