"""The match index against a brute-force reference on seeded random token streams (longest match, most
recent occurrence; a match across one changed token), through appends and rewinds; the cross-request cache stays
within its token bound."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from localspec.speculative.suffix import (
    CONSENSUS_MAX,
    GAP_MAX,
    GAP_MIN,
    MAX_MATCH,
    RUNGS,
    SEPARATOR,
    Match,
    MatchIndex,
    SuffixCache,
)


def brute_longest(tokens: list[int], query: list[int], before: int) -> Match | None:
    """Longest suffix of query (≤ MAX_MATCH) ending in tokens at a position < before; most recent wins. Its
    consensus: of the most recent CONSENSUS_MAX occurrences (ending < before, with a follower that is not a
    separator) of the query's last n tokens, n the largest rung ≤ the length, how many go on as this one."""
    for length in range(min(MAX_MATCH, len(query)), 0, -1):
        pat = query[len(query) - length:]
        for e in range(min(before, len(tokens)) - 1, length - 2, -1):
            if tokens[e - length + 1:e + 1] == pat:
                rung = max(r for r in RUNGS if r <= length)
                gram = query[len(query) - rung:]
                nxt = tokens[e + 1] if e + 1 < len(tokens) else SEPARATOR
                follow = [tokens[f + 1] for f in range(min(before, len(tokens)) - 1, rung - 2, -1)
                          if tokens[f - rung + 1:f + 1] == gram and f + 1 < len(tokens)
                          and tokens[f + 1] != SEPARATOR][:CONSENSUS_MAX]
                if not follow:
                    return Match(length, e + 1)
                return Match(length, e + 1, len(follow), sum(t == nxt for t in follow))
    return None


def brute_gapped(tokens: list[int], max_gap: int = GAP_MAX, min_length: int = GAP_MIN) -> Match | None:
    """The ending is A x B, |B| = g: A's longest earlier match (most recent among the longest, as brute_longest
    finds it) at least min_length long, followed there by y != x and then B, its copy starting before x. The
    longest |A| + g over g, the smaller g on a tie."""
    n, best = len(tokens), None
    for g in range(1, max_gap + 1):
        slot = n - g - 1
        if slot < 2:
            break
        a = brute_longest(tokens, tokens[:slot], slot - 1)
        if a is None or a.length < min_length:
            continue
        start = a.end + 1 + g
        if start < slot and tokens[a.end] != tokens[slot] and tokens[a.end + 1:start] == tokens[n - g:]:
            if best is None or a.length + g > best.length:
                best = Match(a.length + g, start)
    return best


def templated(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Random tokens and copies of earlier spans with a token or two changed: a template and its slots."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.5:
            s = rng.randrange(len(out))
            span = out[s:s + rng.randint(4, 40)]
            for _ in range(rng.randint(1, 2)):
                span[rng.randrange(len(span))] = rng.randrange(vocab)
            out.extend(span)
        else:
            out.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 6)))
    return out[:n]


def stream(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Random tokens with copied spans, so long matches (past several rungs) happen."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.4:
            s = rng.randrange(len(out))
            out.extend(out[s:s + rng.randint(1, 90)])
        else:
            out.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 6)))
    return out[:n]


@pytest.mark.parametrize("seed", range(10))
def test_longest_matches_brute_force_as_tokens_arrive(seed):
    rng = random.Random(seed)
    toks = stream(rng, 300, vocab=rng.choice([2, 3, 8, 50]))
    idx = MatchIndex()
    for i, t in enumerate(toks):
        idx.append(t)
        got = idx.longest(idx.tokens, len(idx) - 1)
        assert got == brute_longest(toks[:i + 1], toks[:i + 1], i), (seed, i)


@pytest.mark.parametrize("seed", range(8))
def test_gapped_matches_brute_force_as_tokens_arrive(seed):
    rng = random.Random(300 + seed)
    toks = templated(rng, 260, vocab=rng.choice([3, 8, 50]))
    idx, found = MatchIndex(), 0
    for i, t in enumerate(toks):
        idx.append(t)
        got = idx.gapped()
        assert got == brute_gapped(toks[:i + 1]), (seed, i)
        found += got is not None
    assert found  # the streams do hold templates with a changed token


def test_a_numbered_list_is_copied_on_across_its_number():
    """"1. press the reset button\n2. press the reset button\n3." (as tokens): after "3 ." the plain match is
    two tokens, the match across the changed number is the whole line, and the copy goes on after it."""
    line = [10, 11, 12, 13, 14, 15, 16]  # " press the small reset button on the" ...
    toks = [1, 99] + line + [50] + [2, 99] + line + [50] + [3, 99]
    idx = MatchIndex()
    idx.extend(toks)
    m = idx.gapped()
    assert m is not None and m.length == len(line) + 2 + 1  # A: line, "\n" and the number before; B: "."
    assert idx.continuation(m, 8) == line + [50]
    idx.extend([4])  # the number is the last token, nothing after it agrees yet: no gapped match
    assert idx.gapped() is None


def test_longest_of_a_prefix_of_the_query():
    idx = MatchIndex()
    idx.extend([5, 6, 7, 8, 1, 5, 6, 7, 9])
    assert idx.longest(idx.tokens, 7, end=8) == idx.longest([5, 6, 7, 8, 1, 5, 6, 7], 7)
    assert idx.longest(idx.tokens, 7, end=8).length == 3


@pytest.mark.parametrize("seed", range(6))
def test_rewind_to_a_common_prefix_equals_a_fresh_index(seed):
    rng = random.Random(100 + seed)
    idx = MatchIndex()
    for _ in range(8):  # requests that share a prefix with the previous one, then diverge
        keep = rng.randint(0, len(idx))
        idx.truncate(keep)
        idx.extend(stream(rng, rng.randint(1, 150), vocab=6))
        fresh = MatchIndex()
        fresh.extend(idx.tokens)
        assert idx._ends == fresh._ends
        q = idx.tokens
        assert idx.longest(q, len(q) - 1) == brute_longest(q, q, len(q) - 1)


def test_long_match_capped_and_most_recent():
    block = list(range(100, 200))
    idx = MatchIndex()
    idx.extend(block + [1] + block + [2] + block)
    m = idx.longest(idx.tokens, len(idx) - 1)
    assert (m.length, m.end) == (MAX_MATCH, 201) and idx.continuation(m, 3) == [2, 100, 101]
    assert (m.support, m.agree) == (2, 1) and m.split  # the block went on as 1 once and as 2 once


@pytest.mark.parametrize("seed", range(10))
def test_a_loop_is_copied_on_through_itself(seed):
    """An occurrence that runs into the end of the tokens (the ending repeats with period p): with `wrap` the
    continuation is the periodic extension, checked against the brute force; without, it stops after p."""
    rng = random.Random(seed)
    head = [rng.randrange(50) for _ in range(rng.randint(0, 20))]
    cycle = [100 + rng.randrange(50) for _ in range(rng.randint(1, 12))]
    toks = head + cycle * rng.randint(2, 6) + cycle[:rng.randrange(len(cycle))]
    idx = MatchIndex()
    idx.extend(toks)
    m = idx.longest(idx.tokens, len(idx) - 1)
    p = len(toks) - m.end
    assert m == brute_longest(toks, toks, len(toks) - 1) and 0 < p < m.length
    k = rng.randint(1, 40)
    periodic = [toks[len(toks) - p + i % p] for i in range(k)]
    assert idx.continuation(m, k, wrap=True) == periodic
    assert idx.continuation(m, k) == periodic[:p]


def test_external_query_and_separator_stop_drafts():
    cache = SuffixCache(max_tokens=64, min_doc=2)
    cache.add([5, 6, 7, 8])
    cache.add([9, 5, 6, 1])
    m = cache.longest([0, 9, 5, 6])
    assert (m.length, m.end) == (3, len([5, 6, 7, 8]) + 1 + 3) and cache.index.continuation(m, 4) == [1]
    m = cache.longest([7, 8])
    assert m is not None and cache.index.continuation(m, 4) == []  # the document ended there
    assert cache.longest([42]) is None and SEPARATOR not in cache.docs[0]


@pytest.mark.slow
def test_cache_memory_is_bounded():
    rng = random.Random(7)
    cache = SuffixCache(max_tokens=2000)
    tracemalloc.start()
    for _ in range(60):
        cache.add(stream(rng, rng.randint(50, 700), vocab=30000))
        assert len(cache) <= 2000
    first, _ = tracemalloc.get_traced_memory()
    for _ in range(200):
        cache.add(stream(rng, rng.randint(50, 700), vocab=30000))
        assert len(cache) <= 2000
    now, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert now < 1.5 * first + 1_000_000  # steady state: no growth with the number of requests
    assert cache.longest(cache.docs[-1][:40]) is not None  # the newest document is still there
