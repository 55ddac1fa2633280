"""The γ controller (`--draft ... -k auto`) against fixed draft lengths on a simulated pair, no model loaded.

A round drafts k tokens; the first is accepted with probability a1, each later one (its predecessors accepted)
with ac, as a model drafter's runs are; the drafter costs c target steps a token and a verify of k+1 rows v(k).
The costs are those `localspec bench` measured for Gemma-3-270M F32 and F16 with their Q4_0 self copies on a
2-core CPU. Eight answers of 128 tokens from an empty cache, as a pair's first run; 20 seeds. It prints tokens
per target step for k = 2, 4, 8 and auto, and auto ÷ the best of those and plain
(docs/bench/adaptive.md#measured-before-judged).

    python scripts/bench/simulate_auto.py            # the table of cases
    python scripts/bench/simulate_auto.py g16 0.86 0.95
"""

from __future__ import annotations

import sys

import numpy as np

from localspec.speculative.types import Step
from localspec.tuning.controller import Adaptive
from localspec.tuning.fixed import FixedK
from localspec.tuning.rate import v_at

T1 = 0.04  # seconds of a target step: only ratios matter
PAIRS = {  # c, v(0..8) as the bench measured them
    "g32": (0.46, [1, 1.21, 1.47, 1.46, 1.54, 1.66, 1.85, 1.78, 1.81]),
    "g16": (0.56, [1, 1.30, 1.40, 1.54, 1.65, 1.75, 1.89, 2.06, 2.24]),
}
CASES = [("g32", 0.88, 0.93), ("g32", 0.85, 0.97), ("g32", 0.75, 0.9), ("g16", 0.86, 0.95), ("g16", 0.83, 0.95),
         ("g16", 0.8, 0.9), ("g32", 0.5, 0.8), ("g32", 0.3, 0.5)]


def rate(ctl: Adaptive | FixedK, a1: float, ac: float, c: float, v: list[float], seed: int,
         answers: int = 8, n: int = 128) -> float:
    """Tokens per target step over `answers` answers of `n` tokens each."""
    rng = np.random.default_rng(seed)
    spent = made = 0.0
    for _ in range(answers):
        got, first = 0, True
        while got < n:
            k = ctl.choose_k()
            if k and isinstance(ctl, Adaptive):
                k = ctl.k_for("model")
            accepted = 0
            while accepted < k and rng.random() < (a1 if accepted == 0 else ac):
                accepted += 1
            cost = k * c + v_at(v, k)
            spent, made, got = spent + cost, made + accepted + 1, got + accepted + 1
            ctl.observe(Step(tuple(range(accepted + 1)), k, accepted, k * c * T1, cost * T1, "model" if k else "",
                             n_prompt=10 if first else 0))
            first = False
    return made / spent


def row(pair: str, a1: float, ac: float, seeds: int = 20) -> str:
    c, v = PAIRS[pair]
    out = {k: float(np.mean([rate(FixedK(k), a1, ac, c, v, s) for s in range(seeds)])) for k in (2, 4, 8)}
    auto = float(np.mean([rate(Adaptive(sources=("model",), v=v, t1=T1, c={"model": c}, learn_costs=False,
                                        prior={"model": (0.7, 0.85)}), a1, ac, c, v, s) for s in range(seeds)]))
    best = max(1.0, *out.values())
    fixed = " | ".join(f"{x:.3f}" for x in out.values())
    return f"| {pair} | {a1} | {ac} | {fixed} | {auto:.3f} | {auto / best:.3f} |"


def main(argv: list[str]) -> None:
    cases = [(argv[0], float(argv[1]), float(argv[2]))] if argv else CASES
    print("| pair | a1 | ac | k=2 | k=4 | k=8 | auto | auto ÷ best |\n|---|---|---|---|---|---|---|---|")
    for case in cases:
        print(row(*case))


if __name__ == "__main__":
    main(sys.argv[1:])
