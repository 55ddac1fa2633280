"""Match-aware prompt lookup on the real SmolLM2-135M: lossless at T=0 (every emitted token is the target's
argmax of its verify row) and at T>0 (χ² on the first sampled token), and the cross-request cache drafts in a
second request that shares text but not a prefix with the first."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.backend import LoadOptions, Model
from localspec.bench.samples import LOOKUP_TASKS, REWRITE, REWRITE_START
from localspec.engine.engine import Engine
from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import warp
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.loop import generate
from localspec.speculative.reindent import Indents
from localspec.speculative.suffix import SuffixCache
from localspec.speculative.types import LOOKUP_CACHE, LOOKUP_LOOP, LOOKUP_REINDENT
from localspec.tuning.controller import Adaptive
from localspec.tuning.fixed import FixedK

pytestmark = pytest.mark.slow

QUIET_CPU_V = (1.0, 1.5, 1.95, 2.4, 2.85, 3.3, 3.75, 4.2, 4.65)


@pytest.fixture(scope="module")
def target(smollm2_path):
    """One thread: these tests count tokens, not time, and a single thread suffers least on a shared machine."""
    m = Model.load(smollm2_path, LoadOptions(n_ctx=1024, n_threads=1))
    yield m
    m.close()


def chat(engine: Engine, text: str, start: str = "") -> list[int]:
    return engine.tokenize(engine.chat_prompt([{"role": "user", "content": text}]) + start)


LOOP = "Repeat after me: hello world hello world hello world hello world"  # the model goes on repeating it
NESTED = LOOKUP_TASKS["json"][1]  # SmolLM2-135M answers with JSON nested deeper and deeper: reindented copies
# a function copied into a class, four spaces deeper, three lines in: the rest is a reindented copy
CART = ("def mean_price(items):\n    s = 0\n    n = 0\n    for item in items:\n        s += item.price\n"
        "        n += 1\n    return s / n\n\n\nclass Cart:\n    def mean_price(self, items):\n        s = 0\n"
        "        n = 0\n        for item in items:\n            s")


@pytest.mark.parametrize("prompt", ["rewrite", "loop", "nested", "cart"])
def test_greedy_every_token_is_the_target_argmax(target, prompt):
    seen: list[np.ndarray] = []
    inner = target.decode

    def decode(tokens, logits_rows=1):
        out = inner(tokens, logits_rows)
        if logits_rows:
            seen.append(out.copy())  # decode returns a view, valid until the next decode
        return out

    target.decode = decode
    try:
        toks = {"rewrite": lambda: chat(Engine(target), REWRITE, REWRITE_START), "loop": lambda: target.tokenize(LOOP),
                "nested": lambda: chat(Engine(target), NESTED), "cart": lambda: target.tokenize(CART)}[prompt]()
        lookup = PromptLookup(indents=Indents.of(target))
        steps = list(generate(target, toks, drafter=lookup, controller=FixedK(8), max_tokens=96))
    finally:
        del target.decode
    assert len(seen) == len(steps)
    for step, rows in zip(steps, seen):
        assert list(step.tokens) == [int(r.argmax()) for r in rows[:len(step.tokens)]]
    by = {s.source for s in steps if s.drafted}
    accepted = sum(s.accepted for s in steps)
    print(f"\nlookup greedy {prompt}: sources {sorted(by)}, accepted {accepted}, {len(steps)} passes for "
          f"{sum(len(s.tokens) for s in steps)} tokens")
    assert accepted >= 20 and by <= set(PromptLookup.sources)
    if prompt == "loop":  # drafted as an overlapping copy, past the end of the context
        assert LOOKUP_LOOP in by
    # whether SmolLM2's nested JSON repeats a block at another depth moves with the CPU's numerics; the function
    # copied into a class does, wherever it runs
    if prompt == "cart":
        assert LOOKUP_REINDENT in by


@pytest.mark.parametrize("text", ["red green blue red green blue red green blue red green", CART])
def test_sampled_first_token_follows_the_target(target, text):
    """The first sampled token follows the target's distribution (χ²) with a draft proposed every time: a
    verbatim one, and a reindented copy."""
    from scipy import stats as sstats

    params = SamplingParams(temperature=1.0, top_k=5)
    toks = target.tokenize(text)
    target.rewind(0)
    logits = target.decode(toks, 1)
    p = warp(logits, params).dense(logits.shape[-1])[0]
    target.rewind(0)
    support = np.flatnonzero(p)
    counts = dict.fromkeys(support.tolist(), 0)
    rng = np.random.default_rng(5)
    n, drafted = 200, 0
    lookup = PromptLookup(indents=Indents.of(target))
    for _ in range(n):
        step = next(iter(generate(target, toks, drafter=lookup, params=params, controller=FixedK(2),
                                  max_tokens=3, rng=rng)))
        counts[step.tokens[0]] += 1
        drafted += step.drafted > 0 and step.source == (LOOKUP_REINDENT if text == CART else "lookup:mid")
    assert drafted == n  # lookup proposed every time (" blue" follows " red green"; CART: reindented)
    chi2 = sstats.chisquare([counts[t] for t in support], p[support] * n)
    assert chi2.pvalue > 0.01


def test_cache_drafts_from_an_earlier_request(target):
    ctl = Adaptive(sources=PromptLookup.sources, v=QUIET_CPU_V, t1=0.005, c=PromptLookup.cost, learn_costs=False)
    engine = Engine(target, PromptLookup(cache=SuffixCache(4096)), controller=ctl)
    for _ in engine.generate(chat(engine, REWRITE, REWRITE_START), max_tokens=64):
        pass
    # the same request behind a system message: no common prefix past the first tokens, so the first request
    # (its answer included) is in the cache, and the answer it gave, renamed variable and all, is there to copy
    again = engine.tokenize(engine.chat_prompt([{"role": "system", "content": "You are a careful programmer."},
                                                {"role": "user", "content": REWRITE}]) + REWRITE_START)
    last = None
    for last in engine.generate(again, max_tokens=64):
        pass
    by = last.stats.by_source
    print(f"\ncache request: {by}")
    assert by[LOOKUP_CACHE][1] > 0


def test_reindented_copy_where_indentation_is_its_own_token(gemma_path):
    """Gemma-3's vocabulary writes a newline and the spaces after it as two tokens (SmolLM2's as one): the copy
    into the class is drafted with its runs of spaces moved from 8 to 12."""
    m = Model.load(gemma_path, LoadOptions(n_ctx=512, n_threads=1))
    try:
        toks = m.tokenize(CART)
        d = PromptLookup(indents=Indents.of(m)).propose(toks, lambda s: 8, SamplingParams(),
                                                         np.random.default_rng(0))
        assert d.source == LOOKUP_REINDENT
        assert m.detokenize(list(d.tokens)).startswith(" += item.price\n            n +=")
    finally:
        m.close()
