"""What a verify round of n rows costs against one plain step, with logits for every row (what greedy or sampled
verification needs) and for the last row only (a prefill): the difference is the output layer's share.

Speculation pays only while scoring γ+1 rows costs little more than one. On a 2-core CPU a small model's
single-token step is already compute-bound, so rows cost nearly their number, and a large vocabulary makes each
row's logits dear (Gemma-3-270M: 262,144 × 640 output weights, more than the rest of the model):

    python scripts/verify_rows.py MODEL.gguf [--rows 1,2,4,8,16,32,64] [--depth 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--depth", type=int, default=512, help="cached positions before the timed rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    model = Model.load(a.model, LoadOptions(n_ctx=a.depth + max(rows) + 16, n_threads=a.threads))
    n = model.n_vocab
    model.decode([(17 * i + 5) % n for i in range(a.depth)], 1)
    follow = [(31 * i + 7) % n for i in range(max(rows))]
    print(f"{a.threads} threads, depth {a.depth}")
    print("| rows | one step (ms) | logits for every row (× one step) | for the last row only | output layer |")
    print("|---|---|---|---|---|")
    for r in rows:
        t1, every, last = ratios(model, a.depth, follow[:r], a.repeats)
        print(f"| {r} | {1e3 * t1:.2f} | {every:.2f} | {last:.2f} | {100 * (1 - last / every):.0f} % |")
    model.close()


if __name__ == "__main__":
    main()
