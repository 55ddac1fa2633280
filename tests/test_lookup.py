"""Prompt lookup by match strength, as pure units: the drafter names the bucket its match falls in, the
controller keeps each bucket's acceptance apart, rounds a bucket did not draft never count against it, and the
cross-request cache feeds drafts after a rewind. No models, no clocks."""

from __future__ import annotations

import numpy as np

from localspec.models import LOOKUP
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.suffix import SuffixCache
from localspec.speculative.types import (
    EMPTY,
    LOOKUP_CACHE,
    LOOKUP_GAPPED,
    LOOKUP_LONG,
    LOOKUP_LOOP,
    LOOKUP_MID,
    LOOKUP_SHORT,
    LOOKUP_VERBATIM,
    Step,
)
from localspec.tuning.controller import Adaptive
from localspec.tuning.fixed import FixedK

CPU_V = [1.0, 1.45, 1.9, 2.4, 2.8, 3.3, 3.7, 4.2, 4.6]
P, RNG = SamplingParams(), np.random.default_rng(0)
SOURCES = PromptLookup.sources


def asked(k: int = 8):
    log: list[str] = []

    def k_for(source: str) -> int:
        log.append(source)
        return k
    return k_for, log


def test_bucket_follows_match_length():
    lk = PromptLookup(mid_at=4, long_at=12, verbatim_at=20)
    text = list(range(100, 130))
    k_for, log = asked(5)
    assert lk.propose(text + [7, 100, 101], k_for, P, RNG).tokens == (102, 103, 104, 105, 106)
    assert log == [LOOKUP_SHORT]
    d = lk.propose(text + [7] + text[:5], k_for, P, RNG)
    assert d.source == LOOKUP_MID and d.tokens == tuple(text[5:10])
    d = lk.propose(text + [7] + text[:14], k_for, P, RNG)
    assert d.source == LOOKUP_LONG and d.tokens == tuple(text[14:19])
    d = lk.propose(text + [7] + text[:20], k_for, P, RNG)
    assert d.source == LOOKUP_VERBATIM and d.tokens == tuple(text[20:25])
    assert lk.propose([1, 2, 3], k_for, P, RNG) is EMPTY  # nothing repeats: no source is even asked
    assert log == [LOOKUP_SHORT, LOOKUP_MID, LOOKUP_LONG, LOOKUP_VERBATIM]


def test_a_loop_is_its_own_bucket_and_drafts_past_the_end_of_the_context():
    """A model repeating a few tokens: the longest match's occurrence overlaps the ending, so the draft is the
    loop copied on (as many tokens as asked), under a bucket of its own; a short repeat is no loop."""
    lk = PromptLookup(mid_at=3, long_at=8, verbatim_at=16)
    k_for, log = asked(12)
    ctx = [1, 2, 3] + [7, 8, 9, 10] * 4
    d = lk.propose(ctx, k_for, P, RNG)
    assert d.source == LOOKUP_LOOP and d.tokens == (7, 8, 9, 10) * 3 and log == [LOOKUP_LOOP]
    d = lk.propose([1, 2, 3, 7, 8, 7, 8, 7], k_for, P, RNG)  # a 5-token overlap: below long_at
    assert d.source != LOOKUP_LOOP and d.tokens[:1] == (8,)


def test_a_split_match_drops_a_level_and_a_split_short_one_drafts_nothing():
    lk = PromptLookup(mid_at=3, long_at=8, verbatim_at=16)
    k_for, log = asked(4)
    # "5 6 7" was followed by 8 once and by 9 once: the text does not agree on what comes next
    ctx = [5, 6, 7, 8, 1, 2, 5, 6, 7, 9, 3, 4, 5, 6, 7]
    d = lk.propose(ctx, k_for, P, RNG)
    assert d.source == LOOKUP_SHORT and d.tokens[0] == 9  # a 3-token match, split: mid -> short
    assert lk.propose([1, 5, 2, 5, 3, 5], k_for, P, RNG) is EMPTY  # "5" went on as 2 and 3: split short
    assert log == [LOOKUP_SHORT]


def test_a_template_is_copied_on_across_its_slot_as_a_bucket_of_its_own():
    """Items that differ in one token (a number, a name): once a token after the slot agrees, the match across
    it is drafted as `lookup:gapped`; where the plain match is as long, the plain one drafts."""
    lk = PromptLookup(mid_at=3, long_at=8, verbatim_at=16)
    k_for, log = asked(6)
    item = list(range(20, 32))  # ". Press the small reset button on the back of the router.\n" ...
    ctx = [900, 1] + item + [2] + item + [3, 20]
    d = lk.propose(ctx, k_for, P, RNG)
    assert d.source == LOOKUP_GAPPED and d.tokens == tuple(item[1:7]) and log == [LOOKUP_GAPPED]
    plain = [900] + item + [5] + item[:10]  # the item again, unchanged so far: a 10-token plain match
    d = lk.propose(plain, k_for, P, RNG)
    assert d.source == LOOKUP_LONG and d.tokens == tuple(item[10:12]) + (5,) + tuple(item[:3])


def test_each_bucket_starts_from_its_declared_prior():
    ctl = Adaptive(sources=SOURCES, v=CPU_V, t1=0.005, c=PromptLookup.cost, prior=PromptLookup.prior)
    st = ctl.state()
    assert st.alpha[LOOKUP_VERBATIM][0] > st.alpha[LOOKUP_LONG][0] > st.alpha[LOOKUP_MID][0] \
        > st.alpha[LOOKUP_SHORT][0]
    assert st.k[LOOKUP_VERBATIM] >= st.k[LOOKUP_MID] > 0 and st.k[LOOKUP_SHORT] == 0  # weak: off until shown


def test_off_bucket_is_not_asked_for_more_and_draft_is_capped():
    lk = PromptLookup(max_draft=40)
    text = list(range(50))
    assert lk.propose(text + text[:30], {LOOKUP_VERBATIM: 0}.get, P, RNG) is EMPTY
    assert lk.propose(text + text[:30], lambda s: 100, P, RNG).tokens == tuple(text[30:] + text[:20])
    assert lk.propose(text + text[:30], lambda s: 100, P, RNG).tokens == tuple(text[30:] + text[:20])


def test_cache_drafts_after_a_rewind_and_context_wins_ties():
    cache = SuffixCache(max_tokens=1000)
    lk = PromptLookup(cache=cache)
    doc = list(range(200, 260))
    lk.propose([1] + doc + [2], lambda s: 4, P, RNG)  # request 1 indexes its context
    d = lk.propose([1, 3] + doc[:20], lambda s: 4, P, RNG)  # request 2 rewinds: request 1 went to the cache
    assert d.source == LOOKUP_CACHE and d.tokens == tuple(doc[20:24])
    assert len(cache) > 0
    assert lk.propose([1, 4] + doc[:10], lambda s: 4, P, RNG).source != LOOKUP_CACHE  # too short to trust
    d = lk.propose([1, 3] + doc[:20] + [9] + doc[:20], lambda s: 4, P, RNG)
    assert d.source != LOOKUP_CACHE  # its own context matches as long: the context is preferred


def test_cache_wins_over_a_long_context_match_that_it_outmatches():
    """The prompt holds the old text, the cache the edited one (an edit asked for again): where the prompt's
    copy goes on with the old text, the cache's longer match knows the edit."""
    old, edit = list(range(300, 340)), list(range(400, 404))
    new = old[:30] + edit + old[30:]
    lk = PromptLookup(cache=SuffixCache(max_tokens=1000))
    lk.propose([1] + old + [2] + new, lambda s: 4, P, RNG)  # request 1: the old text and its edited answer
    d = lk.propose([1] + old + [2] + new[:30], lambda s: 8, P, RNG)  # asked again, its answer 30 tokens in
    assert d.source == LOOKUP_CACHE and d.tokens[:4] == tuple(edit)


def step(drafted: int, accepted: int, source: str) -> Step:
    return Step(tuple(range(accepted + 1)), drafted, accepted, 0.0, CPU_V[drafted] * 0.005,
                source if drafted else "")


def round_(ctl: Adaptive, source: str | None, accept: bool) -> int:
    """One loop round: choose_k, the drafter asks for its match's bucket (None: no match), observe."""
    ctl.choose_k()
    k = ctl.k_for(source) if source else 0
    ctl.observe(step(k, k if accept else 0, source) if k else step(0, 0, ""))
    return k


def test_weak_matches_do_not_switch_off_strong_ones():
    ctl = Adaptive(sources=SOURCES, v=CPU_V, t1=0.005, c=PromptLookup.cost)
    for i in range(120):
        round_(ctl, LOOKUP_SHORT if i % 2 else LOOKUP_LONG, accept=not i % 2)
    st = ctl.state()
    assert st.k[LOOKUP_SHORT] == 0 and LOOKUP_SHORT in st.off
    assert st.k[LOOKUP_LONG] >= 4 and st.spec_disabled_reason is None
    assert ctl.choose_k() >= 4 and ctl.k_for(LOOKUP_LONG) >= 4


def test_rounds_a_source_did_not_draft_never_switch_it_off():
    ctl = Adaptive(sources=SOURCES, v=CPU_V, t1=0.005, c=PromptLookup.cost)
    before = ctl.state()
    for _ in range(500):  # no match at all, or only matches in other buckets that fail
        round_(ctl, None, accept=False)
        round_(ctl, LOOKUP_SHORT, accept=False)
    st = ctl.state()
    for s in (LOOKUP_MID, LOOKUP_LONG, LOOKUP_CACHE):
        assert s not in st.off and st.k[s] == before.k[s] > 0 and st.alpha[s] == before.alpha[s]


def test_a_probe_waits_for_a_round_its_bucket_drafts():
    ctl = Adaptive(sources=SOURCES, v=CPU_V, t1=0.005, c=PromptLookup.cost, probe_every=4, probe_max=64)
    while LOOKUP_SHORT not in ctl.state().off:
        round_(ctl, LOOKUP_SHORT, accept=False)
    every = ctl.src[LOOKUP_SHORT].probe_every
    for _ in range(50):  # rounds with no short match: the owed probe is not spent, the interval not doubled
        round_(ctl, None, accept=False)
    assert ctl.src[LOOKUP_SHORT].probe_every == every and ctl.k_for(LOOKUP_SHORT) > 0
    assert round_(ctl, LOOKUP_SHORT, accept=True) > 0  # drafted now
    assert ctl.src[LOOKUP_SHORT].probe_every == 2 * every


def test_a_controller_told_only_the_family_learns_each_bucket():
    ctl = Adaptive(sources=(LOOKUP,), v=CPU_V, t1=0.005, c={LOOKUP: 0.0})
    for i in range(60):
        round_(ctl, LOOKUP_SHORT if i % 2 else LOOKUP_LONG, accept=not i % 2)
    assert ctl.k_for(LOOKUP_LONG) > 0 and LOOKUP_SHORT in ctl.state().off and ctl.src[LOOKUP_LONG].c == 0.0
    assert FixedK(3).k_for(LOOKUP_SHORT) == 3
