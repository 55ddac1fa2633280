"""Drafters: cheap guesses at the next k tokens, behind one small protocol.

A drafter sees the whole accepted context (prompt + emitted tokens) and returns up to `k_for(source)`
tokens, with the distributions q they were drawn from, or None when the choice was deterministic (point
mass). It does not decide how much to draft: `k_for` is the controller's answer for the source the drafter
is about to use (0 = do not draft from it). It declares what it costs (`cost`: c per source, 0 for a free
drafter, None = measure it), so the controller never has to recognise a drafter by name.
A new drafter is a new class, not a new branch in the loop.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..models import LOOKUP
from ..sampling.constrain import constrain_row
from ..sampling.params import SamplingParams
from ..sampling.warp import Warped, stack, warp
from .reindent import Indents
from .suffix import MAX_MATCH, Match, MatchIndex, SuffixCache
from .types import (
    EMPTY,
    LOOKUP_CACHE,
    LOOKUP_GAPPED,
    LOOKUP_LONG,
    LOOKUP_LOOP,
    LOOKUP_MID,
    LOOKUP_REINDENT,
    LOOKUP_SHORT,
    LOOKUP_VERBATIM,
    Draft,
    Drafter,
    KFor,
)

if TYPE_CHECKING:
    from ..backend import Model


# How often a match of each strength is copied on (α of the first drafted token, α of the later ones; by draft
# position for verbatim copies and loops): the controller's prior until this session's own rounds speak.
# Replayed on recorded answers, then taken lower (docs/bench/lookup.md#lookup-prior).
LOOKUP_PRIOR = {LOOKUP_SHORT: (0.35, 0.8), LOOKUP_MID: (0.75, 0.9), LOOKUP_LONG: (0.9, 0.93),
                LOOKUP_VERBATIM: (0.97, 0.95, 0.97, 0.99, 0.995), LOOKUP_CACHE: (0.9, 0.95),
                LOOKUP_LOOP: (0.97, 0.97, 0.99, 0.995, 0.998), LOOKUP_GAPPED: (0.9, 0.93),
                LOOKUP_REINDENT: (0.9, 0.93)}  # a reindented copy: taken as a long match, its own rounds correct it
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (vectorised: contexts are thousands of tokens)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class PromptLookup:
    """Prompt lookup decoding (Saxena 2023), match-aware: find the longest earlier occurrence of the context's
    ending (most recent first, from an index kept as tokens arrive: speculative/suffix.py) and propose the tokens
    that followed it. Free, and strong on edits, RAG and extraction.

    The match length names the draft's source, a bucket the controller keeps its own acceptance for
    (`LOOKUP_SHORT` < `mid_at` ≤ `LOOKUP_MID` < `long_at` ≤ `LOOKUP_LONG` < `verbatim_at` ≤ `LOOKUP_VERBATIM`),
    so weak 1-2-token matches that fail do not switch off the strong ones; the controller answers
    `k_for(bucket)` from that bucket's estimate, which starts from the bucket's measured `LOOKUP_PRIOR`.
    With a `SuffixCache`, earlier requests (previous turns, answers, the same file asked about again) are
    searched too, every round; a cache match is used when it is longer than the context's own
    (`LOOKUP_CACHE`), at least `cache_min` long, and its earlier requests agree on what follows (shorter cache
    matches cost more than they gained: docs/bench/lookup.md#match-buckets). A long match whose
    occurrence overlaps the ending is a loop (`LOOKUP_LOOP`), drafted as an overlapping copy that runs past the
    end of the context. With the target's `Indents`, a match at least `verbatim_at` long and `reindent_margin`
    longer when indentation is ignored is a copy at another depth (`LOOKUP_REINDENT`, speculative/reindent.py;
    not shorter: such matches are still learning the nesting's period, fail, and switch the bucket off). The context is
    handed to the cache when a request rewinds past it. Where a template's slot broke the match (a list number, a
    name), a match across that one token at least `gap_margin` longer than the plain one is `LOOKUP_GAPPED`
    (suffix.MatchIndex.gapped). Drafts are point masses: the verify rule stays lossless."""

    # typed as the Drafter protocol types them (its attributes are settable, so they must match exactly)
    name: str = LOOKUP
    sources: tuple[str, ...] = (LOOKUP_SHORT, LOOKUP_MID, LOOKUP_LONG, LOOKUP_VERBATIM, LOOKUP_CACHE, LOOKUP_LOOP,
                                LOOKUP_REINDENT, LOOKUP_GAPPED)
    # dict look-ups: microseconds against a target step of milliseconds
    cost: Mapping[str, float | None] = {s: 0.0 for s in sources}
    prior: Mapping[str, tuple[float, ...]] = LOOKUP_PRIOR

    def __init__(self, *, mid_at: int = 3, long_at: int = 8, verbatim_at: int = 16,
                 cache: SuffixCache | None = None, cache_min: int = 16, max_draft: int = 64,
                 indents: Indents | None = None, reindent_margin: int = 4, gap_margin: int = 4) -> None:
        if not 1 < mid_at < long_at < verbatim_at:
            raise ValueError(f"need 1 < mid_at < long_at < verbatim_at, got {mid_at}, {long_at}, {verbatim_at}")
        self.mid_at, self.long_at, self.verbatim_at = mid_at, long_at, verbatim_at
        self.cache_min, self.max_draft = cache_min, max_draft
        self.cache = cache
        self.index = MatchIndex()
        self.indents, self.reindent_margin, self.gap_margin = indents, reindent_margin, gap_margin
        self.flat = MatchIndex()  # the context with indentation flattened (kept only with `indents`)
        self._shift = 0  # the last reindented match's shift, in spaces
        self._synced: Sequence[int] | None = None  # the context list last indexed (see `sync`)

    def bucket(self, m: Match) -> str | None:
        """The match's strength: its length, one level down when the text continued it in more than one way
        (such a match is copied on far less often: docs/bench/lookup.md#match-buckets).
        None: too weak to draft (a split 1-2-token match)."""
        level = sum(m.length >= n for n in (self.mid_at, self.long_at, self.verbatim_at)) - m.split
        return None if level < 0 else self.LEVELS[level]

    LEVELS = (LOOKUP_SHORT, LOOKUP_MID, LOOKUP_LONG, LOOKUP_VERBATIM)

    def sync(self, context: Sequence[int]) -> None:
        """Bring the index to `context` by common prefix; what a rewind drops goes to the cache. Within a
        request the loop passes the same list, only ever extended: then nothing needs comparing."""
        idx = self.index
        same = context is self._synced and len(context) >= len(idx)
        keep = len(idx) if same else common_prefix(idx.tokens, context)
        self._synced = context
        if keep < len(idx):
            if self.cache is not None:  # the kept prefix stays searchable here; a margin keeps matches across it
                self.cache.add(idx.tokens[max(0, keep - MAX_MATCH):])
            idx.truncate(keep)
        idx.extend(context[keep:])
        if self.indents is not None:
            flat = self.flat
            if len(flat) > keep:
                flat.truncate(keep)
            flat.extend([self.indents.flat(t) for t in idx.tokens[len(flat):]])

    def find(self, context: Sequence[int]) -> tuple[str, MatchIndex, Match] | None:
        """(source, where, match) for the strongest match: the context's own, unless the cache matches longer
        (and its earlier requests agree on what follows), or the flat context or a match across a changed token
        longer by a margin."""
        self.sync(context)
        found = self._find_verbatim()
        if found is None or found[0] not in (LOOKUP_CACHE, LOOKUP_LOOP):
            gapped = self.index.gapped()
            if gapped is not None and gapped.length >= (found[2].length if found else 0) + self.gap_margin:
                found = LOOKUP_GAPPED, self.index, gapped
        need = max(self.verbatim_at, (found[2].length if found else 0) + self.reindent_margin)
        if self.indents is not None and need <= MAX_MATCH:  # else no flat match could be long enough
            flat = self.flat
            fm = flat.longest(flat.tokens, len(flat) - 1)
            if fm is not None and fm.length >= need:
                shift = self.indents.shift(self.index.tokens, fm.end, fm.length)
                if shift:
                    self._shift = shift
                    return LOOKUP_REINDENT, self.index, fm
        return found

    def _find_verbatim(self) -> tuple[str, MatchIndex, Match] | None:
        idx = self.index
        m = idx.longest(idx.tokens, len(idx) - 1)
        if self.cache is not None:
            cm = self.cache.longest(idx.tokens)
            if (cm is not None and cm.length >= self.cache_min and not cm.split
                    and (m is None or cm.length > m.length)):
                return LOOKUP_CACHE, self.cache.index, cm
        if m is not None and m.length >= self.long_at and len(idx) - m.end < m.length:
            return LOOKUP_LOOP, idx, m  # the ending repeats with period len - end: copied on through itself
        if m is None:
            return None
        source = self.bucket(m)
        return (source, idx, m) if source is not None else None

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        found = self.find(context)
        if found is None:
            return EMPTY
        k = min(k_for(found[0]), self.max_draft)
        if k <= 0:
            return EMPTY
        tokens = self.continuation(found, k)
        return Draft(tuple(tokens), None, found[0]) if tokens else EMPTY

    def continuation(self, found: tuple[str, MatchIndex, Match], k: int) -> list[int]:
        """Up to k tokens that followed the match `find` returned: copied on through the context's own ending
        (a loop), or with the indentation moved (a reindented copy)."""
        source, where, m = found
        if source == LOOKUP_REINDENT and self.indents is not None:  # only found with indents
            return self.indents.moved(self.index.tokens[m.end:m.end + k], self._shift)
        return where.continuation(m, k, wrap=where is self.index and source != LOOKUP_GAPPED)

    def close(self) -> None:
        pass


class ModelDrafter:
    """A small model with the target's tokenizer. Its KV cache follows the accepted context by common
    prefix: each round decodes only what it has not seen (the tokens accepted since), never the prompt again."""

    name: str = "model"
    sources: tuple[str, ...] = ("model",)
    cost: Mapping[str, float | None] = {"model": None}  # measured at load (calibration) and refined online
    # a model pair's acceptance is learnt online; the prior says only that a draft token whose predecessors were
    # accepted is likelier to be (Gemma-3-270M F32's Q4_0 copy: 79 % of first positions, 93 % of the later ones)
    prior: Mapping[str, tuple[float, ...]] = {"model": (0.7, 0.85)}

    DRAWS = ("coupled", "greedy", "independent")

    def __init__(self, model: "Model", *, p_min: float = 0.0, draw: str = "coupled") -> None:
        if draw not in self.DRAWS:
            raise ValueError(f"draw must be one of {self.DRAWS}, got {draw!r}")
        self.model = model
        self.p_min = p_min  # stop drafting once the drafter's own top probability falls below this (0 = never)
        # how a sampled request's draft token i is chosen from q_i (docs/sampling.md, "Which rule runs when"):
        # "coupled" (default): at the uniform the target will draw at that position (peeked, not consumed):
        #   the target's sample matches it whenever q_i and p_i put that uniform on the same token; the draft
        #   depends on the RNG state only, so the same-seed rule verifies it and the text is plain decoding's
        # "greedy": the argmax of q_i (the same-seed rule too; accepted with probability p_i(argmax q_i))
        # "independent": drawn from q_i with the RNG, verified by rejection sampling (same distribution, but a
        #   seed no longer gives plain decoding's text)
        self.draw = draw

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        k = k_for(self.name)
        if k <= 0:
            return EMPTY
        m = self.model
        keep = m.restore(min(common_prefix(m.tokens, context), len(context) - 1))  # recurrent: maybe less
        room = m.n_ctx - (len(context) - keep) - m.n_past
        k = min(k, room + 1)
        if k <= 0:
            return EMPTY
        logits = m.decode(context[keep:], 1)[0]
        m.checkpoint("draft")  # the next round starts from here or later: a recurrent drafter comes back to it
        tokens: list[int] = []
        qs: list[Warped] = []
        draw = "greedy" if params.greedy else self.draw
        u = peek(rng, k) if draw == "coupled" else []
        first_at = 0.0
        for i in range(k):
            logits = constrain_row(params, logits, context, tokens)  # q constrained as p is (constrain.py)
            q = warp(logits, params, context, tokens)  # the history the target's verify row i will see
            if draw == "coupled":
                t = q.pick(0, u[i])
            elif draw == "greedy":
                t = int(q.ids[0, int(np.argmax(q.probs[0]))])
            else:
                t = q.sample(rng)
                qs.append(q)
            tokens.append(t)
            if i == 0:
                first_at = time.perf_counter()
            if i < k - 1:
                logits = m.decode([t], 1)[0]
                if self.p_min > 0 and _top_prob(logits) < self.p_min:
                    break  # the drafter is unsure of the next token: verify what we have
        return Draft(tuple(tokens), stack(qs) if qs else None, self.name, fed=len(context) - keep,
                     first_at=first_at)

    def close(self) -> None:
        self.model.close()


def peek(rng: np.random.Generator, n: int) -> list[float]:
    """The next n values of `rng.random()`, leaving the generator where it was: the uniforms the same-seed rule
    will draw for the next n positions (verify.verify_same_seed)."""
    bg = rng.bit_generator
    state = bg.state
    try:
        return [rng.random() for _ in range(n)]
    finally:
        bg.state = state


def _top_prob(logits: np.ndarray) -> float:
    """max softmax(logits), without forming the distribution."""
    z = logits - logits.max()
    return float(1.0 / np.exp(z).sum())


class HybridDrafter:
    """Prompt lookup first (free); the drafter with a cost (a model drafter, or the target's own MTP head) only
    when lookup has no match. `Draft.source` says which one drafted, so stats and the controller keep per-source
    acceptance, and `k_for` is asked per source: a controller can keep the free lookup on while the costly
    drafter does not pay."""

    name: str = "hybrid"

    def __init__(self, lookup: PromptLookup, model: Drafter) -> None:
        self.lookup, self.model = lookup, model
        self.sources: tuple[str, ...] = (*lookup.sources, *model.sources)
        self.cost: Mapping[str, float | None] = {**lookup.cost, **model.cost}
        self.prior: Mapping[str, tuple[float, ...]] = {**lookup.prior, **model.prior}

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        for d in (self.lookup, self.model):
            draft = d.propose(context, k_for, params, rng)
            if len(draft):
                return draft
        return EMPTY

    def close(self) -> None:
        self.model.close()
