"""A model drafter's time per round as a fixed part and a part per drafted token, fitted from its rounds.

A round of a model drafter decodes the token the target added before its first draft token, samples, and trims
its cache: time that does not grow with γ. Priced per token alone (c = drafting time ÷ γ), that fixed part is
spread over γ, so c depends on the γ it was timed at, and a session that drafts short makes every longer draft
look dearer than it is. SmolLM2-135M F32's Q4_0 copy, traced over two runs: 16 ms at γ 1, 25-27 at γ 2, 36-37 at 3,
48-54 at 5, that is 8.5 ms + 8.5 ms a token against a 25 ms step (f 0.34, c 0.34); c timed at γ 2 was 0.5, and at
it a draft of 8 tokens looked one target step dearer than it is. The bench said the same from the other side: its
formula would pick k = 2 where k = 4 ran fastest (Gemma-3-270M F32 and its copy, docs/bench/adaptive.md#stale-depth).

So rounds that differ in γ (exploring one further does that every few rounds) fit t_draft ÷ t1 = f + c·γ by
least squares, each round weighing `KEEP` of the one after it; until their γ spread is wide enough to tell f from
c, f keeps its last value (0 at first) and c follows the rounds' time beyond f per token.
"""

from __future__ import annotations

from dataclasses import dataclass

KEEP = 0.97  # a round's weight in the fit relative to the next one's (about the last 30 rounds count)
MIN_SPREAD = 0.04  # the weighted variance of the rounds' γ needed to tell f from c (one round in 16 one longer: 0.06)


@dataclass
class DraftCost:
    """Decayed least-squares sums of (γ, drafting time in target steps) over a drafter's rounds."""

    s0: float = 0.0
    s1: float = 0.0
    s2: float = 0.0
    sy: float = 0.0
    sdy: float = 0.0

    def add(self, gamma: int, steps: float) -> None:
        """Count one round that drafted `gamma` tokens in `steps` target steps."""
        self.s0, self.s1, self.s2 = KEEP * self.s0 + 1, KEEP * self.s1 + gamma, KEEP * self.s2 + gamma * gamma
        self.sy, self.sdy = KEEP * self.sy + steps, KEEP * self.sdy + gamma * steps

    def fit(self) -> tuple[float, float] | None:
        """(f, c) from the rounds so far, or None while their γ are too alike to tell the two apart. A fixed part
        the fit puts below 0 (timing noise) is taken as 0, c then fitted through the origin."""
        if self.s0 <= 0:
            return None
        det = self.s0 * self.s2 - self.s1 * self.s1
        if det < MIN_SPREAD * self.s0 * self.s0:
            return None
        c = (self.s0 * self.sdy - self.s1 * self.sy) / det
        f = (self.sy - c * self.s1) / self.s0
        if f < 0:
            f, c = 0.0, self.sdy / self.s2
        return (f, c) if c > 0 else None

    def rebase(self, factor: float) -> None:
        """The times as they read against a t1 `factor` times the one they were timed against (machine.py)."""
        self.sy /= factor
        self.sdy /= factor
