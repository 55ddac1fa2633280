"""Speculation on the structure: draft the text a request's grammar (or JSON schema, as GBNF) forces.

A tool call's or a schema's JSON is mostly fixed text: keys in order, punctuation, const and single enum
values. Where the grammar leaves the next text no choice, the target will write it whatever it samples, so a
draft of it is accepted (up to the target's own tokenization of that text).

The forced continuation, per token: the grammar's allowed-next set is "forced" when one allowed token's bytes
extend every other allowed token's bytes (a prefix chain: `"`, `"lo`, `"location` for a fixed key), and the
draft takes that longest token; a set with two diverging tokens (a free string, a choice) ends the draft.
Rules this keeps:
- the draft is a function of the context and the grammar only, never of the sampling draws, so the same-seed
  verify rule applies: one seed, one text, with it on or off (docs/design.md "The verify rule");
- every drafted token is one the grammar allows after the drafts before it: it never proposes forbidden text;
- it may propose fewer tokens than allowed (nothing forced: an empty draft, or the fallback drafter's).
`StructureDrafter` composes with prompt lookup: structure first where the grammar forces text, the fallback
(lookup) otherwise.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..sampling.constrain import GrammarState
from ..sampling.params import SamplingParams
from .types import EMPTY, Draft, Drafter, KFor

STRUCTURE = "structure"  # the source name of drafts the grammar forces
# forced text is written whatever the target samples, up to its tokenization: a high prior on every position
STRUCTURE_PRIOR = (0.9, 0.9)
_MAX_CHAIN = 64  # an allowed set larger than this is a free choice (a string's contents), never a prefix chain

Piece = Callable[[int], bytes]


def forced_tokens(state: GrammarState, k: int, piece: Piece, *, is_eog: Callable[[int], bool] = lambda t: False
                  ) -> tuple[int, ...]:
    """Up to k tokens the grammar forces from `state` (not changed: the walk runs on a clone). Stops at the first
    position whose allowed set is not a prefix chain, or whose forced token ends generation."""
    out: list[int] = []
    g = state.clone()
    try:
        while len(out) < k:
            t = forced_next(g.mask(), piece)
            if t is None or is_eog(t):
                break
            out.append(t)
            g.accept(t)
    finally:
        g.close()
    return tuple(out)


def forced_next(mask: np.ndarray, piece: Piece) -> int | None:
    """The token an allowed-next mask forces: the one whose bytes every other allowed token's bytes begin, or
    None (nothing allowed, an empty piece, or a real choice)."""
    ids = np.flatnonzero(mask)
    if len(ids) == 0 or len(ids) > _MAX_CHAIN:
        return None
    pieces = [(piece(int(t)), int(t)) for t in ids]
    longest, best = max(pieces, key=lambda p: (len(p[0]), -p[1]))
    if not longest:
        return None
    if all(longest.startswith(p) for p, _ in pieces):
        return best
    return None


class StructureDrafter:
    """Drafts what the request's grammar forces (`params.constraint`'s grammar); otherwise asks `fallback`
    (prompt lookup), when there is one. A request without a grammar drafts from the fallback only."""

    name: str = STRUCTURE

    def __init__(self, piece: Piece, *, is_eog: Callable[[int], bool] = lambda t: False,
                 fallback: Drafter | None = None) -> None:
        self.piece, self.is_eog, self.fallback = piece, is_eog, fallback
        extra = fallback.sources if fallback else ()
        self.sources: tuple[str, ...] = (STRUCTURE, *extra)
        # a mask per drafted token: cheap next to a target step, counted as free (the controller corrects α)
        self.cost: Mapping[str, float | None] = {STRUCTURE: 0.0, **(fallback.cost if fallback else {})}
        self.prior: Mapping[str, tuple[float, ...]] = {STRUCTURE: STRUCTURE_PRIOR,
                                                      **(fallback.prior if fallback else {})}
        self._pieces: dict[int, bytes] = {}

    def _piece(self, t: int) -> bytes:
        p = self._pieces.get(t)
        if p is None:
            p = self._pieces[t] = self.piece(t)
        return p

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        c = params.constraint
        state = c.state(context) if c is not None else None
        if state is not None:
            k = k_for(STRUCTURE)
            if k > 0:
                tokens = forced_tokens(state, k, self._piece, is_eog=self.is_eog)
                if tokens:
                    return Draft(tokens, None, STRUCTURE)
        if self.fallback is not None:
            return self.fallback.propose(context, k_for, params, rng)
        return EMPTY

    def close(self) -> None:
        if self.fallback is not None:
            self.fallback.close()
