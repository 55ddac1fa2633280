"""What speculation did in one request, named the same by every front end (`run`, `--json`, the chat, the server,
the metrics log): one rule, so a label always means the same thing.

A controller lives across requests; `ControllerState.since(before)` gives one request's rounds, and `outcome`
turns them and the request's statistics into an `Outcome`. `Engine.generate` puts it on the last `Chunk`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..speculative.types import ControllerState

SPEC, PLAIN, AUTO_OFF = "spec", "plain", "auto-off"


@dataclass(frozen=True)
class Outcome:
    """What speculation did in one request: `run`, `--json`, the chat, the server and the metrics log all
    report these, so a label always means the same thing."""

    mode: str  # SPEC: drafts were verified; AUTO_OFF: a drafter was on but the controller chose γ = 0 in every
    #            round; PLAIN: otherwise (speculation off, or the drafter found nothing to propose)
    k: int  # the γ the controller chose in most of this request's rounds; 0 when nothing was drafted
    k_chosen: dict[int, int]  # this request's rounds by the γ chosen
    reason: str | None = None  # the controller's words while it keeps speculation off


def request_mode(draft_n: int, rounds: int, *, drafting: bool, k_chosen: Mapping[int, int]) -> str:
    """The one rule for a request's mode (see `Outcome.mode`)."""
    if draft_n:
        return SPEC
    if drafting and rounds and not any(k > 0 for k in k_chosen):
        return AUTO_OFF
    return PLAIN


def outcome(before: ControllerState | None, after: ControllerState | None, *, draft_n: int,
            rounds: int) -> Outcome:
    """A request's `Outcome` from the controller's state before and after it (None: no drafter in use)."""
    if after is None:
        return Outcome(PLAIN, 0, {})
    req = after.since(before)
    mode = request_mode(draft_n, rounds, drafting=True, k_chosen=req.k_chosen)
    return Outcome(mode, req.k_mode if mode == SPEC else 0, dict(req.k_chosen), after.spec_disabled_reason)
