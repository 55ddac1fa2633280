"""Where did the context's ending occur before? An index kept as tokens arrive, for prompt lookup.

`MatchIndex` answers: the longest suffix of a query (capped at `MAX_MATCH` tokens) that occurs in the indexed
tokens ending before a given position, and, among those occurrences, the most recent. The tokens that followed
that occurrence are the draft. Match length is what makes a lookup draft trustworthy (SuffixDecoding, Oliaro et
al. 2024: draft length scaled by match length; llama.cpp's ngram-simple drafts only after a 12-token match).

Index: for each rung n in `RUNGS` (1, 2, 4, ... 64), a dict from the hash of the n-gram ending at position i to
the ascending list of such i. Appending a token costs one dict append per rung; rewinding pops the same entries
(lists are ascending, so the ones to drop are at the ends). A query finds the largest rung whose n-gram occurred:
the longest match L then lies in [n, 2n), every occurrence of length L is among that rung's positions, and a
backward comparison over them (most recent first) finds L exactly. Hashes only pick candidates; every length is
compared token by token, so a collision can never produce a wrong draft.

`MatchIndex.gapped` finds a match across one changed token: a template's slot (a list number, a name, a day) breaks
the plain match, and the copy resumes after it.

`SuffixCache` is the same index over earlier requests (prompts and answers), bounded in tokens: the oldest
documents are dropped first.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Sequence

RUNGS = (1, 2, 4, 8, 16, 32, 64)
MAX_MATCH = RUNGS[-1]  # a match this long is as strong as it gets; longer ones are not told apart
SEPARATOR = -1  # between cached documents: never equal to a token, so no match or draft crosses it


CONSENSUS_MAX = 8  # occurrences looked at (most recent first) to tell whether the text agrees on what follows
GAP_MAX, GAP_MIN = 3, 6  # a gapped match: at most this many tokens confirmed after the slot, at least this many before


@dataclass(frozen=True)
class Match:
    length: int  # tokens of the query's suffix matched (1..MAX_MATCH)
    end: int  # index just past the earlier occurrence: its continuation starts at tokens[end]
    support: int = 1  # earlier occurrences of the match's n-gram (its rung; at most CONSENSUS_MAX) with a follower
    agree: int = 1  # ... followed by the same token as this occurrence

    @property
    def split(self) -> bool:
        """The text continued this n-gram in more than one way: which way comes next is a guess."""
        return self.agree < self.support


class MatchIndex:
    """The tokens seen so far and, per rung, where each n-gram ended (see the module docstring)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._ends: dict[int, dict[int, list[int]]] = {n: {} for n in RUNGS}

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        toks = self.tokens
        toks.append(token)
        i = len(toks) - 1
        for n in RUNGS:
            if n > i + 1:
                break
            self._ends[n].setdefault(hash(tuple(toks[i - n + 1:])), []).append(i)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(int(t))

    def truncate(self, length: int) -> None:
        """Forget everything from position `length` on (a rewind: the next request shares only a prefix)."""
        toks = self.tokens
        for i in range(len(toks) - 1, length - 1, -1):
            for n in RUNGS:
                if n > i + 1:
                    break
                key = hash(tuple(toks[i - n + 1:i + 1]))
                ends = self._ends[n][key]
                ends.pop()  # ascending, and i is the largest left
                if not ends:
                    del self._ends[n][key]
            toks.pop()

    def longest(self, query: Sequence[int], before: int, end: int | None = None) -> Match | None:
        """The longest suffix of `query[:end]` (≤ MAX_MATCH) occurring in the index ending at a position <
        `before`; the most recent such occurrence. None when not even the last token occurred."""
        m = len(query) if end is None else end
        cands: list[int] = []
        rung, hi = 0, 0
        for n in RUNGS:
            if n > m:
                break
            ends = self._ends[n].get(hash(tuple(query[m - n:m])))
            if not ends:
                break
            h = bisect_left(ends, before)
            if not h:
                break
            rung, cands, hi = n, ends, h
        if not rung:
            return None
        upper = min(2 * rung - 1, MAX_MATCH, m)  # the next rung missed: no occurrence reaches 2n
        best: Match | None = None
        for j in range(hi - 1, -1, -1):  # most recent first; an older one wins only by being strictly longer
            e = cands[j]
            length = self._back(query, m, e, min(upper, e + 1))
            if best is None or length > best.length:
                best = Match(length, e + 1)
                if length == upper:
                    break
        if best is None or best.length <= 0:
            return None
        return self._consensus(best, list(query[m - rung:m]), cands[:hi])

    def _consensus(self, match: Match, gram: list[int], ends: Sequence[int]) -> Match:
        """`match` with how the most recent occurrences of its rung's n-gram `gram` went on (SuffixDecoding
        scores a continuation by how often it followed; a split is where copies go wrong). A document
        separator is no way of going on; a hash collision is no occurrence."""
        toks, n = self.tokens, len(gram)
        nxt = toks[match.end] if match.end < len(toks) else SEPARATOR
        follow: list[int] = []
        for e in reversed(ends):
            if len(follow) == CONSENSUS_MAX:
                break
            if e + 1 < len(toks) and toks[e + 1] != SEPARATOR and toks[e - n + 1:e + 1] == gram:
                follow.append(toks[e + 1])
        if not follow:
            return match
        return Match(match.length, match.end, len(follow), sum(t == nxt for t in follow))

    def _back(self, query: Sequence[int], m: int, e: int, cap: int) -> int:
        """How many tokens of query[:m]'s suffix equal the tokens ending at position e (at most cap)."""
        toks = self.tokens
        n = 0
        while n < cap and toks[e - n] == query[m - 1 - n]:
            n += 1
        return n

    def gapped(self, max_gap: int = GAP_MAX, min_length: int = GAP_MIN) -> Match | None:
        """A match of the index's own ending across one changed token: the ending is A x B with B the last g
        tokens (1 ≤ g ≤ max_gap), and the most recent of A's longest earlier occurrences (at least `min_length`)
        was followed by another token y ≠ x, then by B. Its `length` is |A| + g and its `end` the token after
        that B: the draft. The longest such match over g; None when there is none.

        A template repeated with a varying slot ("2. Press the button … 3. Press the button …", a name, a day)
        breaks the plain match at every slot; it resumes only once the new instance has its own run of tokens
        again (llama.cpp's ngram-simple waits for 12). Across the slot, A says which instance is being copied and
        B that the copy goes on after it. B must be there (g ≥ 1): drafting on the slot alone, as a guessed
        substitution, lost (docs/bench/lookup.md#lookup-priors)."""
        toks, n = self.tokens, len(self.tokens)
        best: Match | None = None
        for g in range(1, max_gap + 1):
            slot = n - g - 1  # the changed token's position in the ending
            if slot < 2:
                break
            a = self.longest(toks, slot - 1, end=slot)
            if a is None or a.length < min_length:
                continue
            start = a.end + 1 + g  # the occurrence's slot is at a.end, its B after it
            if start >= slot or toks[a.end] == toks[slot] or toks[a.end + 1:start] != toks[n - g:]:
                continue
            if best is None or a.length + g > best.length:
                best = Match(a.length + g, start)
        return best

    def continuation(self, match: Match, k: int, *, wrap: bool = False) -> list[int]:
        """Up to k tokens after the match, stopping at a document separator. `wrap` (the match is of these
        tokens' own ending): an occurrence that runs into the end, p tokens before it, says the text repeats
        with period p, and the copy goes on through what it has copied (an LZ77 overlapping copy). A small
        model caught in a loop repeats a few tokens for the rest of the answer; without the wrap a draft of
        it stops after p tokens (llama.cpp's ngram-mod follows such loops 48-64 tokens at a time)."""
        out = self.tokens[match.end: match.end + k]
        if SEPARATOR in out:
            return out[:out.index(SEPARATOR)]
        p = len(out)
        if wrap and p and p < k and match.end + p == len(self.tokens):
            for i in range(p, k):
                out.append(out[i - p])
        return out


class SuffixCache:
    """Earlier requests' tokens (prompts and answers), searchable like the context, bounded in tokens.

    One per engine, so per model: token ids mean nothing across vocabularies. Documents shorter than
    `min_doc` tokens are not worth keeping. When the total passes `max_tokens`, the oldest documents are
    dropped until half is left and the index is rebuilt (amortised O(1) per token)."""

    def __init__(self, max_tokens: int = 16384, min_doc: int = 8) -> None:
        if max_tokens < 2 * min_doc:
            raise ValueError(f"max_tokens must be at least {2 * min_doc}, got {max_tokens}")
        self.max_tokens, self.min_doc = max_tokens, min_doc
        self.docs: deque[tuple[int, ...]] = deque()
        self.index = MatchIndex()

    def __len__(self) -> int:
        """Tokens held, separators included (what the bound applies to)."""
        return len(self.index)

    def add(self, tokens: Sequence[int]) -> None:
        doc = tuple(int(t) for t in tokens[-(self.max_tokens // 2 - 1):])
        if len(doc) < self.min_doc:
            return
        self.docs.append(doc)
        self.index.extend(doc)
        self.index.append(SEPARATOR)
        if len(self.index) > self.max_tokens:
            while sum(len(d) + 1 for d in self.docs) > self.max_tokens // 2:
                self.docs.popleft()
            self.index = MatchIndex()
            for d in self.docs:
                self.index.extend(d)
                self.index.append(SEPARATOR)

    def longest(self, query: Sequence[int]) -> Match | None:
        return self.index.longest(query, len(self.index))
