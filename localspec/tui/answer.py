"""What the stats panel shows, as one value: the answer being written (or the last one) and the session so far.

The chat folds each batched `Update` into a new `AnswerStats` with `fold` (pure: no widgets, no engine), and the
stats panel renders the result. The words are `run --json`'s: an answer's mode is "spec" (drafts were verified),
"plain" (nothing was drafted) or "auto-off" (a drafter was loaded but the adaptive controller chose plain
decoding in every round); k is the γ the controller chose in most rounds of this answer (`ControllerState.k_mode`
over this answer's rounds); acceptance is accepted / drafted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping

from ..engine.outcome import PLAIN, SPEC, request_mode
from ..engine.stats import Stats

if TYPE_CHECKING:
    from ..speculative.types import ControllerState
    from ..tuning.threads import ThreadState
    from .stream import Update

HISTORY = 60  # points kept in each sparkline


@dataclass(frozen=True)
class AnswerStats:
    stats: Stats = Stats()  # running totals of the current (or last) answer
    mode: str = ""  # that answer: SPEC | PLAIN | AUTO_OFF ("" before the first answer)
    k: int = 0  # γ the controller chose in most rounds of that answer (0: it never chose to draft)
    tps_now: float = 0.0  # tokens/s over the latest batch of rounds
    controller: "ControllerState | None" = None  # the controller after the latest round (None: decoded plainly)
    live: bool = False  # an answer is being written
    finish: str | None = None  # how the last answer ended ("stop", "length", "cancelled", ...)
    done_draft_n: int = 0  # drafted and accepted over the finished answers of this session
    done_accepted: int = 0
    threads: "ThreadState | None" = None  # thread counts after the latest round (None: as loaded, never measured)
    tps_history: tuple[float, ...] = ()  # tokens/s of recent batches
    acc_history: tuple[float, ...] = ()  # acceptance of recent speculative rounds

    @property
    def session_draft_n(self) -> int:
        """Drafted over every answer of the session, the one being written included."""
        return self.done_draft_n + (self.stats.draft_n if self.live else 0)

    @property
    def session_accepted(self) -> int:
        return self.done_accepted + (self.stats.draft_n_accepted if self.live else 0)

    @property
    def off_reason(self) -> str | None:
        """The controller's words for why it decodes plainly now (None while it drafts, or with no controller)."""
        return self.controller.spec_disabled_reason if self.controller else None


def answer_k(controller: "ControllerState | None", k_chosen: Mapping[int, int]) -> int:
    """The γ chosen in most of this answer's rounds, by the controller's own rule (`ControllerState.k_mode`);
    `fold` shows it only when something was drafted, as `outcome.outcome` does for the other front ends."""
    return replace(controller, k_chosen=dict(k_chosen)).k_mode if controller else 0


def fold(a: AnswerStats, upd: "Update") -> AnswerStats:
    """One more batch of rounds of the answer being written."""
    drafting = upd.controller is not None
    tps = (a.tps_history + (upd.tps_now,))[-HISTORY:] if upd.tps_now else a.tps_history
    mode = request_mode(upd.stats.draft_n, upd.stats.rounds, drafting=drafting, k_chosen=upd.k_chosen)
    k = answer_k(upd.controller, upd.k_chosen) if mode == SPEC else 0
    out = replace(a, stats=upd.stats, mode=mode, k=k, tps_now=upd.tps_now or a.tps_now, controller=upd.controller,
                  threads=upd.threads or a.threads, live=True, finish=upd.finish, tps_history=tps,
                  acc_history=(a.acc_history + upd.acceptance)[-HISTORY:])
    return ended(out) if upd.finish else out


def ended(a: AnswerStats) -> AnswerStats:
    """The answer is over (finished, cancelled, or failed mid-way): its drafts count for the session."""
    if not a.live:
        return a
    return replace(a, live=False, done_draft_n=a.done_draft_n + a.stats.draft_n,
                   done_accepted=a.done_accepted + a.stats.draft_n_accepted)


def cleared(a: AnswerStats) -> AnswerStats:
    """A new chat: no answer on screen; the session totals and the sparklines stay."""
    return replace(ended(a), stats=Stats(), mode="", k=0, tps_now=0.0, finish=None)


def reloaded(a: AnswerStats, stats: Stats, saved: Mapping[str, Any]) -> AnswerStats:
    """A saved conversation was opened: show its last answer as it was recorded (`summary.answer_record`)."""
    k = saved.get("k", 0)
    return replace(cleared(a), stats=stats, mode=str(saved.get("mode", PLAIN)), k=k if isinstance(k, int) else 0,
                   finish=saved.get("finish"))
