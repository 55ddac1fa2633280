"""What a drafted round cost, in target steps, as its timings show: the arithmetic behind a model drafter's trial
and probes (controller.py).

A model drafter's time splits three ways. Each drafted token costs c (learnt from drafts of two tokens or more). A
one-token draft costs more than c, because the round's fixed cost (decoding the accepted token, sampling) falls on
one token: SmolLM2-135M's Q4_0 copy, in one trial, 0.56 of a target step a one-token draft against c 0.47. And
before its first draft token it decodes the context it has not seen (a new prompt, or every token since it last
drafted), a prefill priced per token: the same copy took 209 ms for 127 tokens, 6.5 target steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .rate import v_at

if TYPE_CHECKING:
    from ..speculative.types import Step

CATCH_UP_PRIOR = 1 / 8  # a catch-up token's price ÷ c before one is timed: a small model prefills a token for
# 1/8-1/14 of a decode step (SmolLM2-135M's and Gemma-3-270M's Q4_0 copies, 2-core CPU)


def caught_up(step: "Step", k_max: int) -> bool:
    """Whether the drafter first decoded more of the context than a round's accepted tail (plus a plain round's
    token): it caught up on a new prompt, or on rounds it did not draft."""
    return step.fed > k_max + 2


def round_cost(step: "Step", c: float, t1: float, v: Sequence[float], k_max: int) -> float:
    """A drafted round's cost in target steps (t1 seconds each) as timed; a catch-up in it counts as c a drafted
    token, since it is priced apart (`catch_up_price`)."""
    d = step.drafted
    if step.t_verify <= 0:  # the pass evaluated the prompt's tail too: no verify timing of its own
        return d * c + v_at(v, d)
    draft = d * c if caught_up(step, k_max) else step.t_draft / t1
    return draft + step.t_verify / t1


def catch_up_price(step: "Step", c: float, t1: float) -> float:
    """Target steps a context token cost to catch up on, from a round that caught up: its drafting time beyond c
    a drafted token, over the tokens it decoded first."""
    return max(0.0, step.t_draft / t1 - step.drafted * c) / max(step.fed, 1)


def catch_up_cost(price: float | None, c: float, unseen: int) -> float:
    """Target steps to catch up on `unseen` context tokens at `price` a token (None: not timed yet, c ×
    CATCH_UP_PRIOR)."""
    return (price if price is not None else c * CATCH_UP_PRIOR) * max(0, unseen)


def v_with_one_token(v: tuple[float, ...], c: float, c1: float | None) -> tuple[float, ...]:
    """v(γ) with a one-token draft's cost beyond c (c1 - c) added to v(1): with c alone γ 1 looked cheap, and a
    trial sat there (Gemma-3-270M F16 + its Q4_0 copy: 61 of 68 rounds at γ 1, 0.97× plain)."""
    if c1 is None or c1 <= c or len(v) < 2:
        return v
    return (v[0], v[1] + c1 - c, *v[2:])
