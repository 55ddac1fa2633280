"""Replay prompt-lookup drafters on recorded greedy answers: rounds, drafts, acceptance and predicted speed, in
seconds instead of minutes, so a drafting rule can be tuned before it is timed for real (scripts/compare_lookup.py).

Greedy decoding is lossless: the answer is the same whatever was drafted, so the drafts a rule would make and how
many of them the target accepts follow from the recorded answer alone (exactly, up to llama.cpp's batch-size
numerics). A round that drafts d tokens costs v(d) single-token steps (the model's calibrated verify cost), so

    predicted speed-up over plain = answer tokens / Σ_rounds v(d_r)

    python scripts/replay_lookup.py --record runs.json                # plain decoding, every task prompt, each model
    python scripts/replay_lookup.py --record held.json --held-out     # ... the held-out prompts instead
    python scripts/replay_lookup.py --replay runs.json                # every drafting rule on those answers
    python scripts/replay_lookup.py --hazard runs.json                # acceptance by match bucket and position

`--replay` runs localspec's own `PromptLookup` with the default adaptive controller (fed the rounds it would see),
a re-implementation of llama.cpp's ngram-cache drafting rule, and the rules named in `RULES` ("localspec-verbatim":
without reindented copies); it loads each recorded model again for its indentation tokens
(localspec/speculative/reindent.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from bisect import bisect_right
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from localspec.backend import LoadOptions, Model
from localspec.bench.samples import LOOKUP_TASKS
from localspec.engine.loader import EngineConfig
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.reindent import Indents
from localspec.speculative.suffix import SuffixCache
from localspec.speculative.types import Step
from localspec.tuning.controller import Adaptive
from localspec.tuning.estimate import PRIOR_FROM
from localspec.tuning.rate import v_at

GREEDY = SamplingParams()
SINGLE = {*LOOKUP_TASKS, "prose"}  # tasks of one request a prompt; the other recorded tasks are request sequences


def record(path: str, models: list[str], max_tokens: int, threads: int, only: list[str],
           held_out: bool = False) -> None:
    from compare_lookup import Bench, converse, default_models, sequences  # noqa: the same prompts and rendering

    from localspec.bench.samples import LOOKUP_HELD_OUT, LOOKUP_PROSE
    from localspec.speculative.loop import generate

    a = argparse.Namespace(ctx=4096, threads=threads)
    out = []
    for m in models or default_models():
        b = Bench(m, a)
        cal_v, timed = list(b.ctl0.v), sorted(b.ctl0.gammas or ())
        runs = []

        def ask(task: str, request) -> str:
            toks, _ = b.render(request)
            b.fresh()
            answer = [t for s in generate(b.target, toks, max_tokens=max_tokens) for t in s.tokens]
            runs.append({"task": task, "prompt": toks, "answer": answer})
            print(f"{b.name} {task}: {len(answer)} tokens", file=sys.stderr)
            return b.target.detokenize(answer)

        for task, prompts in (LOOKUP_HELD_OUT if held_out else {**LOOKUP_TASKS, "prose": LOOKUP_PROSE}).items():
            for p in prompts if not only or task in only else []:
                ask(task, [{"role": "user", "content": p}])
        for seq, turns in ({} if held_out else sequences()).items():
            if not only or seq in only:
                converse(seq, turns, lambda r: ask(seq, r), len(turns))
        out.append({"model": b.name, "path": m, "v": cal_v, "timed": timed, "runs": runs})
        b.target.close()
    Path(path).write_text(json.dumps(out))


# -- drafting rules ------------------------------------------------------------------------------------------

Rule = Callable[[list[int]], tuple[list[int], str]]  # context -> (draft, source); fed back by `observe`


class Localspec:
    """localspec's PromptLookup and a fresh default Adaptive controller (v from the recording)."""

    def __init__(self, v: Sequence[float], lookup: PromptLookup | None = None, timed: Sequence[int] = (),
                 **ctl) -> None:
        self.lookup = lookup or PromptLookup()
        self.v = list(v)
        self.ctl = Adaptive(sources=self.lookup.sources, k_min=1, k_max=EngineConfig.k_max_lookup, v=v, t1=1.0,
                            gammas=timed, c=dict(self.lookup.cost), prior=self.lookup.prior, **ctl)

    def __call__(self, context: list[int]) -> tuple[list[int], str]:
        k = self.ctl.choose_k()
        if k <= 0:
            return [], ""
        d = self.lookup.propose(context, lambda s: min(self.ctl.k_for(s), k), GREEDY, np.random.default_rng(0))
        return list(d.tokens), d.source

    def observe(self, drafted: int, accepted: int, source: str) -> None:
        t = v_at(self.v, drafted)
        self.ctl.observe(Step((), drafted, accepted, 0.0, t, source))


class NgramCache:
    """llama.cpp's ngram-cache rule (common/ngram-cache.cpp, context cache only): token by token, the most frequent
    follower of the longest of the last 4..1 tokens whose counts pass the 'lax' thresholds; at most 8."""

    SAMPLE = (2, 2, 1, 1)
    PERCENT = (66, 50, 50, 50)

    def __init__(self, v: Sequence[float], n_draft: int = 8) -> None:
        self.n_draft = n_draft
        self.counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        self.seen = 0

    def _update(self, context: list[int]) -> None:
        for i in range(max(self.seen, 1), len(context)):
            for n in range(1, 5):
                if i - n >= 0:
                    self.counts[tuple(context[i - n:i])][context[i]] += 1
        self.seen = len(context)

    def __call__(self, context: list[int]) -> tuple[list[int], str]:
        self._update(context)
        inp = list(context)
        draft: list[int] = []
        while len(draft) < self.n_draft:
            tok = None
            for n in range(4, 0, -1):
                c = self.counts.get(tuple(inp[-n:]))
                if not c:
                    continue
                best, cnt = c.most_common(1)[0]
                tot = sum(c.values())
                if tot < self.SAMPLE[n - 1] or 100 * cnt < self.PERCENT[n - 1] * tot:
                    continue
                tok = best
                break
            if tok is None:
                break
            draft.append(tok)
            inp.append(tok)
        return draft, "ngram-cache"

    def observe(self, drafted: int, accepted: int, source: str) -> None:
        pass


class Oracle:
    """An upper bound, not a drafter: the longest match's continuation (as PromptLookup finds it), cut to the
    tokens the target will accept; nothing drafted when the first would be rejected."""

    def __init__(self, v: Sequence[float]) -> None:
        self.lookup = PromptLookup()
        self.future: list[int] = []

    def __call__(self, context: list[int]) -> tuple[list[int], str]:
        found = self.lookup.find(context)
        if found is None:
            return [], ""
        source = found[0]
        cont = self.lookup.continuation(found, 64)
        n = 0
        while n < len(cont) and n < len(self.future) and cont[n] == self.future[n]:
            n += 1
        return cont[:n], source

    def observe(self, drafted: int, accepted: int, source: str) -> None:
        pass


# (v, the γ calibration timed, the target's indentation tokens) -> rule
RULES: dict[str, Callable[[Sequence[float], Sequence[int], Indents | None], object]] = {
    "oracle": lambda v, timed, ind: Oracle(v),
    "localspec": lambda v, timed, ind: Localspec(v, PromptLookup(indents=ind), timed=timed),
    "localspec+cache": lambda v, timed, ind: Localspec(v, PromptLookup(cache=SuffixCache(), indents=ind),
                                                       timed=timed),
    "localspec-verbatim": lambda v, timed, ind: Localspec(v, timed=timed),
    "ngram-cache": lambda v, timed, ind: NgramCache(v),
}




def replay_one(rule, prompt: list[int], answer: list[int], v: Sequence[float]) -> dict:
    context = list(prompt)
    i = rounds = drafted = accepted = 0
    cost = 0.0
    ks: Counter = Counter()
    while i < len(answer):
        rule.future = answer[i:]
        draft, source = rule(context)
        draft = draft[:len(answer) - i - 1]
        n = 0
        while n < len(draft) and draft[n] == answer[i + n]:
            n += 1
        new = answer[i:i + n + 1]
        rule.observe(len(draft), n, source)
        context.extend(new)
        i += len(new)
        rounds += 1
        drafted += len(draft)
        accepted += n
        cost += v_at(v, len(draft))
        ks[len(draft)] += 1
    return {"tokens": len(answer), "rounds": rounds, "drafted": drafted, "accepted": accepted,
            "speedup": len(answer) / cost if cost else 1.0, "ks": ks}


def indents(path: str | None) -> Indents | None:
    """The recorded model's indentation tokens (reindented copies), when its file is still there."""
    if not path or not Path(path).exists():
        return None
    return Indents.of(Model.load(path, LoadOptions(n_ctx=256)))  # the model stays loaded with it


def replay(path: str, rules: list[str]) -> None:
    data = json.loads(Path(path).read_text())
    print("| model | task | rule | predicted × plain | tokens/round | accepted / drafted |")
    print("|---|---|---|---|---|---|")
    for m in data:
        v, timed, ind = m["v"], m.get("timed", ()), indents(m.get("path"))
        by_task: dict[str, list] = defaultdict(list)
        for r in m["runs"]:
            by_task[r["task"]].append(r)
        for task, runs in by_task.items():
            for name in rules:
                if task not in SINGLE:  # a sequence: one drafter and controller across it, as a session keeps them
                    rule = RULES[name](v, timed, ind)
                    res = [replay_one(rule, r["prompt"], r["answer"], v) for r in runs]
                    sp = sum(x["tokens"] for x in res) / sum(x["tokens"] / x["speedup"] for x in res)
                else:
                    res = [replay_one(RULES[name](v, timed, ind), r["prompt"], r["answer"], v) for r in runs]
                    sp = statistics.median(x["speedup"] for x in res)
                tok = sum(x["tokens"] for x in res) / max(1, sum(x["rounds"] for x in res))
                acc, dr = sum(x["accepted"] for x in res), sum(x["drafted"] for x in res)
                print(f"| {m['model'][:12]} | {task} | {name} | {sp:.2f} | {tok:.2f} | {acc}/{dr} "
                      f"({100 * acc / max(dr, 1):.0f} %) |")


BANDS = (0, *PRIOR_FROM)  # draft positions: the first, then the prior's bands


def hazard(path: str) -> None:
    """Per match bucket and band of draft positions, how often the longest match's continuation was what the
    answer said next, given the positions before it were: at every position of every recorded answer (the
    positions a round drafts from are a subset). What drafters.LOOKUP_PRIOR's values by position rest on."""
    data = json.loads(Path(path).read_text())
    print("| model | bucket | " + " | ".join(f"position {a}" if b == a + 1 else f"positions {a}-{b - 1}"
                                          for a, b in zip(BANDS, BANDS[1:]))
          + f" | {BANDS[-1]} on |")
    print("|---|---|" + "---|" * len(BANDS))
    for m in data:
        counts: dict[str, list[list[int]]] = defaultdict(lambda: [[0, 0] for _ in BANDS])
        ind = indents(m.get("path"))
        for r in m["runs"]:
            lk, context, answer = PromptLookup(indents=ind), list(r["prompt"]), r["answer"]
            for i in range(len(answer)):
                found = lk.find(context)
                if found is not None:
                    for j, t in enumerate(lk.continuation(found, 64)[:len(answer) - i]):
                        band = counts[found[0]][bisect_right(BANDS, j) - 1]
                        band[0] += 1
                        if t != answer[i + j]:
                            break
                        band[1] += 1
                context.append(answer[i])
        for source, bands in sorted(counts.items()):
            cells = [f"{a / n:.3f} ({n})" if n else "–" for n, a in bands]
            print(f"| {m['model'][:12]} | {source} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--record")
    ap.add_argument("--replay")
    ap.add_argument("--hazard", help="recorded runs: acceptance by match bucket and draft position")
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--task", action="append", default=[], help="record only this task or sequence (repeat)")
    ap.add_argument("--held-out", action="store_true",
                    help="record the held-out prompts (samples.LOOKUP_HELD_OUT), not the benchmark's")
    a = ap.parse_args()
    if a.record:
        sys.path.insert(0, str(Path(__file__).parent))
        record(a.record, a.model, a.max_tokens, a.threads, a.task, a.held_out)
    if a.replay:
        replay(a.replay, a.rules.split(","))
    if a.hazard:
        hazard(a.hazard)


if __name__ == "__main__":
    main()
