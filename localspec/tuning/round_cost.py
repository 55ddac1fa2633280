"""What a drafted round cost, in target steps, as its timings show: the arithmetic behind a model drafter's trial
and probes (controller.py).

A model drafter's time splits three ways. Each drafted token costs c. Each round costs a fixed part f besides:
before its first draft token the drafter decodes the round's accepted tail and the target's token, restores its
cache and samples, whatever γ is. Priced per token alone (c = drafting time ÷ γ), f is spread over γ, so c depends
on the γ it was timed at, and a session that drafts short makes longer drafts look dearer than they are:
SmolLM2-135M F32's Q4_0 copy took 16 ms at γ 1, 25-27 at γ 2, 36-37 at 3, 48-54 at 5 against a 25 ms step, about
8.5 ms + 8.5 ms a token (f 0.34, c 0.34), where c timed at γ 2 was 0.5 and priced a draft of 8 a step too dear. So
the drafter times its first token apart (`Draft.first_at`) and the controller learns f and c from the two parts.
And after rounds it did not draft (or a new prompt) it first decodes the context it has not seen, a prefill priced
per token: the same copy took 209 ms for 127 tokens, 6.5 target steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .rate import v_at

if TYPE_CHECKING:
    from ..speculative.types import Step
    from .estimate import SourceEstimate

CATCH_UP_PRIOR = 1 / 8  # a catch-up token's price ÷ c before one is timed: a small model prefills a token for
# 1/8-1/14 of a decode step (SmolLM2-135M's and Gemma-3-270M's Q4_0 copies, 2-core CPU)


def caught_up(step: "Step", k_max: int) -> bool:
    """Whether the drafter first decoded more of the context than a round's accepted tail (plus a plain round's
    token): it caught up on a new prompt, or on rounds it did not draft."""
    return step.fed > k_max + 2


def round_cost(step: "Step", c: float, t1: float, v: Sequence[float], k_max: int, f: float = 0.0) -> float:
    """A drafted round's cost in target steps (t1 seconds each) as timed; a round that caught up counts f + c a
    drafted token, since its catch-up is priced apart (`catch_up_price`). Where the verify is not timed, `v` holds f
    already (`v_with_fixed`)."""
    d = step.drafted
    if step.t_verify <= 0:  # the pass evaluated the prompt's tail too: no verify timing of its own
        return d * c + v_at(v, d)
    draft = f + d * c if caught_up(step, k_max) else step.t_draft / t1
    return draft + step.t_verify / t1


def catch_up_price(step: "Step", c: float, t1: float, f: float = 0.0) -> float:
    """Target steps a context token cost to catch up on, from a round that caught up: its drafting time beyond the
    fixed part f and c a drafted token, over the tokens it decoded first."""
    return max(0.0, step.t_draft / t1 - f - step.drafted * c) / max(step.fed, 1)


def catch_up_cost(price: float | None, c: float, unseen: int) -> float:
    """Target steps to catch up on `unseen` context tokens at `price` a token (None: not timed yet, c ×
    CATCH_UP_PRIOR)."""
    return (price if price is not None else c * CATCH_UP_PRIOR) * max(0, unseen)


def learn_c(est: "SourceEstimate", c_obs: float, w: float) -> None:
    """Move c toward one round's drafting time a token (target steps), with weight w. One round may carry a one-off
    cost (a model drafter catching up on a whole new prompt): it moves c by at most a factor of 2 (+0.1 so a 0 seed
    can grow)."""
    est.c = (1 - w) * est.c + w * min(max(c_obs, 0.0), 2 * est.c + 0.1)


def learn_draft_cost(est: "SourceEstimate", step: "Step", t1: float, w: float) -> None:
    """A model drafter's round, split into its fixed part f and c a drafted token. Timed apart (`Step.t_first`), the
    tokens after the first give c and the time to the first gives f + c. Otherwise a one-token draft gives f + c
    and a longer one f + γ·c; either way each estimate is taken net of the other, which leaves both at their true
    values once both kinds of round have been seen."""
    d = step.drafted
    if step.t_first > 0:
        if d >= 2:
            learn_c(est, (step.t_draft - step.t_first) / ((d - 1) * t1), w)
        f_obs = step.t_first / t1 - est.c
    elif d == 1:
        f_obs = step.t_draft / t1 - est.c
    else:
        learn_c(est, (step.t_draft / t1 - (est.f or 0.0)) / d, w)
        return
    f_obs = max(0.0, f_obs)
    est.f = f_obs if est.f is None else (1 - w) * est.f + w * min(f_obs, 2 * est.f + 0.1)


def v_with_fixed(v: tuple[float, ...], f: float | None) -> tuple[float, ...]:
    """v(γ) with a drafter's fixed cost a round (f, None: not timed) added to every γ ≥ 1. With c alone γ 1 looked
    cheap, and a trial sat there (Gemma-3-270M F16 + its Q4_0 copy: 61 of 68 rounds at γ 1, 0.97× plain); with f
    on γ 1 alone, as before, long drafts looked dear (the module's docstring)."""
    if not f or f <= 0 or len(v) < 2:
        return v
    return (v[0], *(x + f for x in v[1:]))
