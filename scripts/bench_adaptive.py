"""Adaptive speculation benchmark for issue 4 (not a test: speed is measured here, never asserted).

Must-show 2: open prose, hybrid drafter = prompt lookup + the model as its own drafter (c ≈ 1): adaptive
mode should end no slower than 0.95x plain decoding; fixed k shows what it saves.
Must-show 3: a code rewrite where lookup matches: adaptive lookup should choose γ > 1 and beat plain.

Configurations run interleaved round-robin on the same prompts (machine drift hits all alike); each
adaptive request gets a fresh controller seeded by one load-time calibration, so warm-up is included.
Ratios are medians of per-repeat ratios to the plain run of the same repeat.

Usage: python scripts/bench_adaptive.py [--tokens 128] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Callable

from localspec.backend import LoadOptions, Model
from localspec.bench import tables
from localspec.bench.samples import PROSE, REWRITE, REWRITE_START
from localspec.engine.engine import Engine
from localspec.engine.loader import EngineConfig, make_controller
from localspec.models.resolve import resolve_model
from localspec.speculative.drafters import HybridDrafter, ModelDrafter, PromptLookup
from localspec.speculative.types import Controller
from localspec.tuning.calibration import Calibration, measure_calibration
from localspec.tuning.controller import DEFAULT_K, Adaptive, FixedK


def run_once(target: Model, drafter, controller: Controller | None, prompt: list[int], n: int) -> dict:
    """One request from a cold cache (both models); generation tok/s, wall tok/s, acceptance, k histogram."""
    target.rewind(0)
    if isinstance(drafter, HybridDrafter):
        drafter.model.model.rewind(0)
    eng = Engine(target, drafter, controller=controller)
    t0 = time.perf_counter()
    last = None
    for last in eng.generate(prompt, max_tokens=n, spec=drafter is not None):
        pass
    wall = time.perf_counter() - t0
    s = last.stats
    hist = dict(getattr(controller, "k_hist", {}))
    reason = getattr(controller, "spec_disabled_reason", None)
    off = {k: v for k, v in controller.state().off.items()} if isinstance(controller, Adaptive) else {}
    return {"tps": s.tokens_per_second, "wall_tps": s.n_generated / wall, "acc": s.acceptance_rate,
            "mal": s.mean_acceptance_length, "k": hist, "reason": reason, "off": off, "n": s.n_generated,
            "by_source": s.by_source}


def adaptive(cal: Calibration, drafter, k_max: int = 8) -> Controller:
    """The controller `localspec run` builds (loader.make_controller), over this calibration and up to k_max."""
    return make_controller(EngineConfig(k_max=k_max, k_max_lookup=k_max), DEFAULT_K, drafter, cal)


def bench(title: str, configs: dict[str, Callable[[], tuple]], prompts: list[list[int]], n: int,
          repeats: int) -> None:
    rows: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(repeats):
        for p in prompts:
            for name, make in configs.items():
                target, drafter, ctl = make()
                rows[name].append(run_once(target, drafter, ctl, p, n))
    print(f"\n# {title}")
    base = rows["plain"]
    t = tables.grid("config", "tok/s", "vs plain", "wall incl. prefill", "acceptance", "tok/pass", "k chosen",
                    right=range(1, 6))
    offs: list[str] = []
    for name, rs in rows.items():
        ratio = statistics.median(r["tps"] / b["tps"] for r, b in zip(rs, base))
        wratio = statistics.median(r["wall_tps"] / b["wall_tps"] for r, b in zip(rs, base))
        k = Counter()
        for r in rs:
            k.update(r["k"])
        spec = [f"{statistics.median(r['acc'] for r in rs):.2f}", f"{statistics.median(r['mal'] for r in rs):.2f}",
                dict(sorted(k.items()))] if name != "plain" else ["-", "-", "-"]
        tables.add(t, name, f"{statistics.median(r['tps'] for r in rs):.1f}", f"{ratio:.2f}x", f"{wratio:.2f}x", *spec)
        offs += [f"{name} off: {why}" for r in rs for why in r["off"].values()]
    tables.echo(t)
    for line in dict.fromkeys(offs):  # each reason once
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    q4 = resolve_model(None, log=lambda *x: None).path
    opts = LoadOptions(n_ctx=2048, n_threads=a.threads)
    target = Model.load(q4, opts)
    self_model = Model.load(q4, opts)
    cal = measure_calibration(target, k_max=8, draft_model=self_model, budget_s=60.0)
    print(f"calibration: t1 {cal.costs.t_target_ms:.2f} ms, v = {[round(x, 2) for x in cal.v]}, "
          f"c(self) = {cal.costs.c['model']:.2f}")
    chat = Engine(target)

    def hybrid() -> HybridDrafter:
        return HybridDrafter(PromptLookup(), ModelDrafter(self_model))

    def hybrid_adaptive():
        d = hybrid()
        return target, d, adaptive(cal, d)

    def lookup_adaptive():
        d = PromptLookup()
        return target, d, adaptive(cal, d)

    prose = [chat.tokenize(chat.chat_prompt([{"role": "user", "content": p}])) for p in PROSE]
    bench(f"must-show 2: open prose, {a.tokens} tokens, hybrid lookup + self-draft (c = {cal.costs.c['model']:.2f})", {
        "plain": lambda: (target, None, None),
        "hybrid self-draft k=4 fixed": lambda: (target, hybrid(), FixedK(4)),
        "lookup k=4 fixed": lambda: (target, PromptLookup(), FixedK(4)),
        "hybrid self-draft adaptive": hybrid_adaptive,
        "lookup adaptive": lookup_adaptive,
    }, prose, a.tokens, a.repeats)

    code = [chat.tokenize(chat.chat_prompt([{"role": "user", "content": REWRITE}]) + REWRITE_START)]
    bench(f"must-show 3: code rewrite, {a.tokens} tokens, prompt lookup", {
        "plain": lambda: (target, None, None),
        "lookup k=4 fixed": lambda: (target, PromptLookup(), FixedK(4)),
        "lookup k=8 fixed": lambda: (target, PromptLookup(), FixedK(8)),
        "lookup adaptive": lookup_adaptive,
    }, code, a.tokens, a.repeats + 1)


if __name__ == "__main__":
    main()
