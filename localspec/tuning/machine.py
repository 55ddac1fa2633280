"""A machine whose speed changes while a drafter drafts: other load slows every kernel alike, the target's and the
drafter's, so the ratio of their costs stays, but the controller times both against t1, a plain round's time, and
only a plain round measures t1. Between plain rounds (up to T1_REFRESH of them) a slowdown reads as
costlier drafting and verifying. Gemma-3-270M F16 + its Q4_0 copy: the plain step went from 39 to 48-50 ms in the
middle of an answer, c rose from 0.52 to 0.66 and v(2) from 1.52 to 1.76 against the stale 39 ms, the rate fell
from 1.02 to 0.86 and the drafter switched off for that answer (0.89× plain, where k = 4 paid 1.09×).

So a drafter with a cost is switched off only on a fresh t1 (the controller takes a plain round first), and when
that plain round shows the machine slowed as the verify rounds did, what was learnt in the stale unit is rebased.
`StepClock` keeps t1 and counts the drafted rounds since it was timed.
"""

from __future__ import annotations

import math

OFF_T1_FRESH = 8  # a drafter with a cost that is on switches off only on a t1 measured within this many rounds
T1_REFRESH = 32  # a plain round at least this often while a drafter with a cost drafts (and at a request's start)


def shared_change(plain: float, verify: float) -> float:
    """The factor by which the machine itself changed: what both a plain round (t1 new ÷ old) and the verify rounds
    since the last plain one (the v curve's drift) show, the smaller of the two when both moved the same way, else
    1. A change only the verify rounds show is the v curve's own (a verify got costlier relative to one row: a busy
    machine has fewer idle cores for the extra rows); one only the plain round shows says nothing of costs that no
    round timed (a drafter that was off)."""
    if plain <= 0 or verify <= 0 or math.log(plain) * math.log(verify) <= 0:
        return 1.0
    return min(plain, verify) if plain > 1 else max(plain, verify)


class StepClock:
    """t1, the recent seconds of a plain round (a fast average: it follows the machine's load), and how stale it is.
    Every cost the controller learns is a ratio to t1, so a t1 from another depth or another moment makes them all
    wrong alike: Gemma-3-270M F32's plain step was 55 ms at a request's depth against 44 ms calibrated, so its
    drafter seemed to cost 0.55 of a step and a verify of 2 rows 1.5, and a drafter that pays 1.2× seemed to lose."""

    def __init__(self, t1: float | None, weight: float = 0.3) -> None:
        self.t1 = t1 or 1e-3
        self.weight = weight  # a plain round's weight in t1 while t1 is fresh; a stale one is replaced
        self.since_plain = T1_REFRESH  # drafted rounds since the last timed plain one (stale at the start)
        self.timed_since = 0  # drafted rounds timed against this t1
        self.scale_at_t1 = 1.0  # the verify curve's scale when t1 was last timed

    @property
    def stale(self) -> bool:
        """Whether a plain round is due: t1 is the calibration's, or T1_REFRESH drafted rounds old."""
        return self.since_plain >= T1_REFRESH

    def expire(self) -> None:
        """Ask for a plain round next (a new request's depth, or a decision that needs a fresh t1)."""
        self.since_plain = T1_REFRESH

    def drafted(self) -> None:
        """Count a drafted round timed against t1."""
        self.since_plain += 1
        self.timed_since += 1

    def plain(self, seconds: float, scale: float) -> float:
        """Take a plain round's time, with the verify curve's scale now; return the change of the machine itself
        since t1 was last timed (`shared_change`; 1.0: none), by which the caller rebases what it learnt. The
        caller sets `scale_at_t1` once it has rebased the curve."""
        w = 1.0 if self.stale else self.weight
        self.since_plain = self.timed_since = 0
        t1 = (1 - w) * self.t1 + w * seconds
        g = shared_change(t1 / self.t1, scale / self.scale_at_t1)
        self.t1 = t1
        return g
