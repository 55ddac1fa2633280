"""Reindented copies (localspec/speculative/reindent.py) on a made-up vocabulary: which tokens are indentation, the flat
index kept beside the context's, and drafts that carry a copy on at its own depth."""

from __future__ import annotations

import random

import numpy as np

from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.reindent import Indents
from localspec.speculative.types import LOOKUP_REINDENT

# token ids: 100 + w is "\n" and w spaces (w = 1..12), 200 + w is w spaces alone, 300 is "\n\n  " (two newlines);
# below 100, words
PIECES = {**{100 + w: b"\n" + b" " * w for w in range(1, 13)}, **{200 + w: b" " * w for w in range(1, 5)},
          300: b"\n\n  "}


def fake_indents() -> Indents:
    text_to_id = {v.decode(): k for k, v in PIECES.items()}

    def tokenize(s: str) -> list[int]:
        return [text_to_id[s]] if s in text_to_id else [0, 0]  # anything else: not one token

    return Indents(lambda t: PIECES.get(t, b"w%d" % t), tokenize)


def nl(w: int) -> int:
    return 100 + w


P, RNG = SamplingParams(), np.random.default_rng(0)


def test_widths_tokens_and_moves():
    ind = fake_indents()
    assert ind.width(nl(4)) == (1, 4) and ind.width(203) == (0, 3) and ind.width(300) == (2, 2)
    assert ind.width(7) is None and ind.width(-1) is None
    assert ind.token((1, 8)) == nl(8) and ind.token((1, 13)) is None and ind.token((0, 9)) is None
    assert ind.flat(nl(4)) == ind.flat(nl(8)) != ind.flat(300) and ind.flat(7) == 7
    assert ind.moved([1, nl(4), 2, nl(8), 3], 4) == [1, nl(8), 2, nl(12), 3]
    assert ind.moved([1, nl(4), 2, nl(12), 3], 4) == [1, nl(8), 2]  # no token for 16 spaces: cut there
    assert ind.moved([1, nl(4), 2], -4) == [1]  # an indentation moved to nothing is no token


def test_a_copy_one_level_deeper_is_drafted_at_its_depth():
    body = [[10, 11, 12], [13, 14], [15, 16, 17], [18, 19], [20, 21, 22], [23, 24], [25, 26, 27], [28, 29]]

    def block(depth: int, lines) -> list[int]:
        return [t for line in lines for t in (nl(depth), *line)]

    original = [1, 2] + block(4, body)
    copy = [3, 4, 5, 6] + block(8, body[:5]) + [nl(8)]  # the body again, in a class: five lines in
    lk = PromptLookup(indents=fake_indents())
    d = lk.propose(original + [7] + copy, lambda s: 8, P, RNG)
    assert d.source == LOOKUP_REINDENT
    assert d.tokens == (23, 24, nl(8), 25, 26, 27, nl(8), 28)
    short = PromptLookup(indents=fake_indents()).propose(original + [7] + copy[:12], lambda s: 8, P, RNG)
    assert short.source != LOOKUP_REINDENT  # two lines in: too short a match to trust


def test_the_same_depth_is_a_verbatim_copy():
    lines = [nl(4), 10, 11, 12, nl(4), 13, 14, nl(4), 15, 16, 17, nl(4), 18, 19, nl(4), 20, 21, 22, nl(4), 23]
    lk = PromptLookup(indents=fake_indents())
    d = lk.propose([1] + lines + [2, 3] + lines[:17], lambda s: 4, P, RNG)
    assert d.source != LOOKUP_REINDENT and d.tokens == (22, nl(4), 23, 2)


def test_the_flat_index_follows_the_context_through_rewinds():
    ind = fake_indents()
    lk = PromptLookup(indents=ind)
    rng = random.Random(3)
    context: list[int] = []
    for _ in range(60):
        if context and rng.random() < 0.3:
            context = context[:rng.randrange(len(context))]  # a new request sharing a prefix
        context = context + [rng.choice([1, 2, 3, nl(4), nl(8), 203, 300]) for _ in range(rng.randrange(1, 9))]
        lk.propose(list(context), lambda s: 4, P, RNG)
        assert lk.flat.tokens == [ind.flat(t) for t in context]
        fresh = PromptLookup(indents=ind)
        fresh.sync(list(context))
        assert all(lk.flat._ends[n] == fresh.flat._ends[n] for n in lk.flat._ends)
