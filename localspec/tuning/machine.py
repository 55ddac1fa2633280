"""A machine whose speed changes while a drafter drafts: other load slows every kernel alike, the target's and the
drafter's, so the ratio of their costs stays, but the controller times both against t1, a plain round's time, and
only a plain round measures t1. Between plain rounds (up to controller.T1_REFRESH of them) a slowdown reads as
costlier drafting and verifying. Gemma-3-270M F16 + its Q4_0 copy: the plain step went from 39 to 48-50 ms in the
middle of an answer, c rose from 0.52 to 0.66 and v(2) from 1.52 to 1.76 against the stale 39 ms, the rate fell
from 1.02 to 0.86 and the drafter switched off for that answer (0.89× plain, where k = 4 paid 1.09×).

So a drafter with a cost is switched off only on a fresh t1 (the controller takes a plain round first), and when
that plain round shows the machine slowed as the verify rounds did, what was learnt in the stale unit is rebased.
"""

from __future__ import annotations

import math

OFF_T1_FRESH = 8  # a drafter with a cost that is on switches off only on a t1 measured within this many rounds


def shared_change(plain: float, verify: float) -> float:
    """The factor by which the machine itself changed: what both a plain round (t1 new ÷ old) and the verify rounds
    since the last plain one (the v curve's drift) show, the smaller of the two when both moved the same way, else
    1. A change only the verify rounds show is the v curve's own (a verify got costlier relative to one row: a busy
    machine has fewer idle cores for the extra rows); one only the plain round shows says nothing of costs that no
    round timed (a drafter that was off)."""
    if plain <= 0 or verify <= 0 or math.log(plain) * math.log(verify) <= 0:
        return 1.0
    return min(plain, verify) if plain > 1 else max(plain, verify)
