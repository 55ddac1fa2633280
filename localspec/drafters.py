"""Drafters: cheap guesses at the next k tokens, behind one small protocol.

A drafter sees the whole accepted context (prompt + emitted tokens) and returns up to `k_for(source)`
tokens, with the distributions q they were drawn from, or None when the choice was deterministic (point
mass). It does not decide how much to draft: `k_for` is the controller's answer for the source the drafter
is about to use (0 = do not draft from it). It declares what it costs (`cost`: c per source, 0 for a free
drafter, None = measure it), so the controller never has to recognise a drafter by name.
A new drafter is a new class, not a new branch in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from .backend import Model
from .sampling import SamplingParams, Warped, stack, warp


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    probs: Warped | None = None  # q, one row per token; None = point mass on each token
    source: str = ""  # which drafter produced it ("lookup", "model"), for per-source stats

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = Draft(())
LOOKUP = "lookup"  # the name of prompt lookup, as a drafter choice and as a draft source
NO_DRAFTER = "none"  # "no speculation", as a drafter choice and in reports

KFor = Callable[[str], int]  # source -> draft length allowed this round (the controller's decision)


class Drafter(Protocol):
    name: str
    sources: tuple[str, ...]  # the `Draft.source` values it produces
    cost: Mapping[str, float | None]  # c per source (drafter time per token ÷ target step); None = measure

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft: ...

    def close(self) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (vectorised: contexts are thousands of tokens)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class PromptLookup:
    """Prompt lookup decoding (Saxena 2023): find the most recent earlier occurrence of the context's last
    n-gram (longest n first) and propose the tokens that followed it. Free, and strong on edits and RAG."""

    name = LOOKUP
    sources = (LOOKUP,)
    cost = {LOOKUP: 0.0}  # a vectorised scan: microseconds against a target step of milliseconds

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, max_draft: int = 16) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}..{ngram_max}")
        self.ngram_max, self.ngram_min, self.max_draft = ngram_max, ngram_min, max_draft

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        k = min(k_for(self.name), self.max_draft)
        if k <= 0:
            return EMPTY
        ctx = np.asarray(context)
        L = len(ctx)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if L <= n:
                continue
            # windows starting at 0..L-n-1 (the final n-gram itself is excluded)
            hit = ctx[: L - n] == ctx[L - n]
            for j in range(1, n):
                hit &= ctx[j: L - n + j] == ctx[L - n + j]
            starts = np.flatnonzero(hit)
            if starts.size:
                s = int(starts[-1]) + n
                return Draft(tuple(int(t) for t in ctx[s: s + k]), None, self.name)
        return EMPTY

    def close(self) -> None:
        pass


class ModelDrafter:
    """A small model with the target's tokenizer. Its KV cache follows the accepted context by common
    prefix: each round decodes only what it has not seen (the tokens accepted since), never the prompt again."""

    name = "model"
    sources = ("model",)
    cost = {"model": None}  # measured at load (calibration) and refined online

    def __init__(self, model: "Model", *, p_min: float = 0.0) -> None:
        self.model = model
        self.p_min = p_min  # stop drafting once the drafter's own top probability falls below this (0 = never)

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        k = k_for(self.name)
        if k <= 0:
            return EMPTY
        m = self.model
        keep = min(common_prefix(m.tokens, context), len(context) - 1)
        m.rewind(keep)
        room = m.n_ctx - (len(context) - keep) - m.n_past
        k = min(k, room + 1)
        if k <= 0:
            return EMPTY
        logits = m.decode(context[keep:], 1)[0]
        tokens: list[int] = []
        qs: list[Warped] = []
        for i in range(k):
            q = warp(logits, params, context, tokens)  # the history the target's verify row i will see
            t = int(q.ids[0, 0]) if params.greedy else q.sample(rng)
            if not params.greedy:
                qs.append(q)
            tokens.append(t)
            if i < k - 1:
                logits = m.decode([t], 1)[0]
                if self.p_min > 0 and _top_prob(logits) < self.p_min:
                    break  # the drafter is unsure of the next token: verify what we have
        return Draft(tuple(tokens), stack(qs) if qs else None, self.name)

    def close(self) -> None:
        self.model.close()


def _top_prob(logits: np.ndarray) -> float:
    """max softmax(logits), without forming the distribution."""
    z = logits - logits.max()
    return float(1.0 / np.exp(z).sum())


class HybridDrafter:
    """Prompt lookup first (free); the model drafter only when lookup has no match. `Draft.source` says
    which one drafted, so stats and the controller keep per-source acceptance, and `k_for` is asked per
    source: a controller can keep the free lookup on while the model drafter does not pay."""

    name = "hybrid"

    def __init__(self, lookup: PromptLookup, model: ModelDrafter) -> None:
        self.lookup, self.model = lookup, model
        self.sources = (*lookup.sources, *model.sources)
        self.cost = {**lookup.cost, **model.cost}

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        for d in (self.lookup, self.model):
            draft = d.propose(context, k_for, params, rng)
            if len(draft):
                return draft
        return EMPTY

    def close(self) -> None:
        self.model.close()
