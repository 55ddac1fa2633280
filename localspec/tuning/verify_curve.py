"""v(γ), a verify of γ+1 rows in plain steps, as the γ controller (controller.py) believes it: calibrated at load,
refined by every round. The calibration is one moment's measurement at one depth: taken while something else ran,
it is off at every γ alike (a stale curve made drafts that did not pay: docs/bench/lookup.md#source-probing). So
every round moves a factor shared by the whole curve and, slowly, its own γ's point.
"""

from __future__ import annotations

from typing import Sequence

from .rate import v_at


class VerifyCurve:
    """v(d) = scale · vr[d]: vr[d] is the calibrated curve refined per d (decayed mean of t_verify(d) / t1, against
    the t1 of the moment, so a busier machine does not skew the ratio), `scale` what every round says of the whole
    curve."""

    SCALE_WEIGHT = 0.25  # how far one round moves the whole v curve towards it (in log terms)
    SCALE_STEP = 1.5  # ... at most this factor a round before the weight: a one-off stall moves it ≤ 11 %
    SCALE_REDECIDE = 0.02  # a change of the curve this large re-decides every source, not only the one observed

    def __init__(self, seed: Sequence[float], k_max: int, weight: float) -> None:
        self.vr: list[float] = [v_at(seed, d) for d in range(k_max + 1)]
        self.scale = self._decided_scale = 1.0  # ... and the factor every source was last decided at
        self.w = weight
        self.v = self._curve()

    def learn(self, d: int, r: float) -> bool:
        """Learn from a verify round of d drafts that cost r plain rounds; True when the curve moved enough that
        every source's decision is due again."""
        r = min(max(r, 1.0), 2 * self.v[d])  # one noisy round moves v(d) by at most a factor of 2; never < 1 row
        f = min(max(r / self.v[d], 1 / self.SCALE_STEP), self.SCALE_STEP)
        self.scale = min(max(self.scale * f ** self.SCALE_WEIGHT, 0.5), 2.0)
        self.vr[d] = (1 - self.w) * self.vr[d] + self.w * r / self.scale
        self.v = self._curve()
        if abs(self.scale / self._decided_scale - 1) <= self.SCALE_REDECIDE:
            return False
        self._decided_scale = self.scale
        return True

    def rebase(self, factor: float) -> None:
        """Express the curve against a t1 `factor` times the one it was learnt against (machine.py): the rounds
        since the last plain round were timed against a t1 the machine has since left."""
        self.scale = min(max(self.scale / factor, 0.5), 2.0)
        self._decided_scale = self.scale
        self.v = self._curve()

    def _curve(self) -> tuple[float, ...]:
        """v(0..k_max) with v(0) = 1, no γ cheaper than one row. Not made monotone: a batch that fills a kernel
        tile costs less than one row fewer (costs.timed_gammas)."""
        return (1.0, *(max(1.0, self.scale * x) for x in self.vr[1:]))
