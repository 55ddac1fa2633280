"""Draft sources as the controller (controller.py) names and bounds them: the range of γ, a bucketed source's family,
and the words a source that is off says why in."""

from __future__ import annotations

from typing import Sequence

from ..models import LOOKUP

DEFAULT_K = 4  # the draft length when nothing else decides it (no pair, no -k, adaptive off)
K_MIN, K_MAX = 1, 8  # the adaptive range of γ when the user says nothing
K_MAX_LOOKUP = 32  # a strong lookup match may copy this far; longer rounds cost more than they save
# (docs/bench/lookup.md#k-max-lookup)


def k_range(sources: Sequence[str], *, k: int | None = None, k_min: int = K_MIN, k_max: int = K_MAX,
            k_max_lookup: int = K_MAX_LOOKUP) -> tuple[int, int]:
    """(k_min, k_max) of γ for a drafter with these sources. An explicit k pins γ; a drafter with prompt lookup
    reaches `k_max_lookup` when k_max was left at its default, because a verbatim copy pays at long γ."""
    if k is not None:
        return k, k
    hi = max(k_min, k_max)
    if k_max == K_MAX and any(family(s) == LOOKUP for s in sources):
        hi = max(hi, k_max_lookup)
    return k_min, hi


def family(source: str) -> str:
    """"lookup" for "lookup:long": the drafter a bucketed source belongs to."""
    return source.split(":", 1)[0]


def off_reason(source: str, alpha: float, c: float, v: float, k: int, rate: float, *, measured: bool = True,
               full: float = 2.0) -> str:
    """Why a source is off, in words first (what a user can act on), the model's numbers after. The acceptance
    is said to be measured only when rounds measured it; `full` is the best rate if every draft were accepted."""
    if full < 1:
        verdict = f"it would be {100 * (1 - full):.0f} % slower here even if every draft were accepted"
    elif not measured:
        verdict = (f"not tried yet: its prior promises {100 * (rate - 1):+.0f} %, too little to start" if rate >= 1
                   else f"not tried yet: by its prior it would be {100 * (1 - rate):.0f} % slower here")
    else:
        verdict = (f"it would be {100 * (1 - rate):.0f} % slower here" if rate < 1
                   else f"it would gain only {100 * (rate - 1):.0f} %, too little to be sure")
    cost = f"verifying {k + 1} tokens costs {v:.1f}× a normal step"
    if c >= 0.05:
        cost += f", each drafted token {c:.2f}×"
    accepted = f"drafts accepted {100 * alpha:.0f} %" if measured else f"prior acceptance {100 * alpha:.0f} %"
    return f"{source}: {verdict} — {accepted}, {cost} (α {alpha:.2f}, c {c:.2f}, v({k}) {v:.2f})"
