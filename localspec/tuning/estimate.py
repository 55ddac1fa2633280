"""What one draft source has shown so far: per-position acceptance as decayed Beta counts over a prior, and its
cost c, with the γ controller's state for the source (on or off, its γ and rate, probing). The controller
(controller.py) keeps one per source and decides from it; the counting lives here."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Sequence

# A prior's values after the first apply from these draft positions on: (first, 1-7, 8-15, 16-31, 32 on), a shorter
# prior's last value to every position after it: a copy that has run on is likely to run on further
# (docs/bench/lookup.md#lookup-prior), which one value for every later position cannot say.
PRIOR_FROM = (1, 8, 16, 32)


@dataclass
class SourceEstimate:
    """What one draft source has shown: per-position acceptance (decayed Beta counts) and its cost c."""

    alpha_prior: float = 0.7  # prior acceptance of the first draft position ...
    later: tuple[float, ...] = ()  # ... and of the later ones, by PRIOR_FROM (empty: each leans on the one before)
    carries: bool = False  # a later position's prior is at least the estimate of the one before it (a model drafter)
    c: float = 0.0
    n: list[float] = field(default_factory=list)  # decayed observations per position (position reached)
    a: list[float] = field(default_factory=list)  # ... accepted
    rounds: int = 0
    on: bool = True
    since_probe: int = 0
    probe_every: int = 0
    rate: float = 1.0
    k: int = 0
    reason: str | None = None
    hopeless: bool = False  # off and not probed: no α could make it pay, or no probe could turn it on yet
    probe_due: bool = False  # off, and a probe is owed the next round this source drafts
    trial: bool = False  # drafting to measure its acceptance before it is judged (controller `_decide`)
    trial_loss: float = 0.0  # target steps the trial's rounds cost beyond the tokens they gave (net)
    undecided: bool = False  # the trial ran out of budget inside the credible band: the next request tries again
    retries: int = 0  # ... with half the budget of the try before
    # a drafter with a cost that turned itself off after drafting, its trial long over: its text may have changed
    # (controller `_new_request` tries it again at the next request, and the next run does)
    switched_off: bool = False
    # it was on, its trial over, at some point of this session: an off it ends in is its last text's verdict, not the
    # pair's (controller `measurements`), so the next run tries it again rather than resuming off
    paid: bool = False
    # target steps per context token the drafter decodes to catch up before it drafts (a model drafter's prefill of
    # what it has not seen: after a new prompt, or rounds it did not draft); None until a round has shown it
    catch_up: float | None = None
    # a model drafter's fixed cost a round beyond c a drafted token, in target steps (round_cost.py); None: not timed
    f: float | None = None
    seen_to: int = 0  # the context's length when this source last drafted in this request (0: not yet)
    # a model drafter's rounds against what its counts predicted, since its text began or its counts last faded:
    # Σ (accepted − α) over the draft positions reached, and Σ α(1 − α), that sum's variance (`surprised`)
    surprise: float = 0.0
    spread: float = 0.0
    # alphas(k) as last computed, until `update` changes the counts: reports read every source's α_1..α_32
    # per request (`state()`, ~0.1 ms for a prompt-lookup drafter) while most rounds update no source
    _alphas: dict[tuple[int, float], tuple[float, ...]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)  # not shared by `replace`

    def alphas(self, k: int, prior_n: float = 2.0) -> list[float]:
        """α_1..α_k: each position's counts over its prior, which is `alpha_prior` for the first and the
        position's value of `later` (by `PRIOR_FROM`) when the drafter declared one, else the estimate of the
        position before. With `carries`, a later position's prior is never below the estimate of the one before:
        a model drafter's accepted tokens come in runs (Gemma-3-270M's Q4_0 copy at k = 8: 0.78 at the first position,
        0.83-1.0 at positions 2-8), and a deep position seldom drafted would otherwise sit at the declared prior
        and keep γ shorter than the text pays for."""
        hit = self._alphas.get((k, prior_n))
        if hit is not None:
            return list(hit)
        out: list[float] = []
        prev = self.alpha_prior
        for i in range(k):
            n = self.n[i] if i < len(self.n) else 0.0
            a = self.a[i] if i < len(self.a) else 0.0
            prior = prev if i == 0 or not self.later else self._later_at(i)
            if i and self.carries:
                prior = max(prior, prev)
            prev = (a + prior_n * prior) / (n + prior_n)
            out.append(prev)
        self._alphas[(k, prior_n)] = tuple(out)
        return out

    def alphas_band(self, k: int, z: float, prior_n: float = 2.0) -> list[float]:
        """α_1..α_k moved z standard deviations of each position's Beta posterior (z > 0 up, z < 0 down): how
        well the counts pin acceptance down. With a prior alone the band is wide; each observed position narrows
        it, so a trial can stop once the decision is the same at both ends."""
        out = []
        for i, m in enumerate(self.alphas(k, prior_n)):
            n = (self.n[i] if i < len(self.n) else 0.0) + prior_n
            out.append(min(1.0, max(0.0, m + z * math.sqrt(m * (1 - m) / (n + 1)))))
        return out

    @property
    def measured(self) -> bool:
        """Whether any round (this session's or a kept one) has shown this source's acceptance."""
        return bool(self.n) and self.n[0] > 0

    def seed(self, n: Sequence[float], a: Sequence[float], rounds: int) -> None:
        """Start from counts an earlier run measured (tuning/acceptance.py), as if its rounds were this one's."""
        self._alphas.clear()
        self.n, self.a, self.rounds = list(n), list(a), rounds

    def _later_at(self, i: int) -> float:
        """The prior of draft position i ≥ 1: the value of `later` for its band (PRIOR_FROM), else the last one."""
        return self.later[min(bisect_right(PRIOR_FROM, i), len(self.later)) - 1]

    def rebase(self, factor: float) -> None:
        """Its timed costs against a t1 `factor` times the one they were timed against (machine.py)."""
        self.c /= factor
        self.f = None if self.f is None else self.f / factor
        self.catch_up = None if self.catch_up is None else self.catch_up / factor

    def fade(self, weight: float) -> None:
        """Weigh every count `weight` of what it did: the estimate moves toward its prior, by that much of its
        distance, without forgetting which way the evidence pointed."""
        self._alphas.clear()
        self.n = [weight * x for x in self.n]
        self.a = [weight * x for x in self.a]
        self.surprise = self.spread = 0.0

    def surprised(self, z: float, least: float = 1.0) -> bool:
        """Whether the rounds since the text began (or the counts last faded) were accepted more, or less, than the
        counts predicted by over z standard deviations, once that sum's variance is `least` or more (about 20 draft
        positions at α 0.95): the text is not the one the counts came from. SmolLM2-135M's Q4_0 copy, after edits it
        drafted at α 0.99, drafted a chat answer whose second positions it got a quarter of the time in its 67 rounds,
        the edits' counts halved (`fade`) and decayed 2 % a round keeping the estimate up (0.77× plain)."""
        return self.spread >= least and abs(self.surprise) > z * math.sqrt(self.spread)

    def update(self, drafted: int, accepted: int, decay: float) -> None:
        """Count one round: each draft position it reached, and whether that position was accepted. A model
        drafter's round that was accepted whole also ages the counts past its draft (`carries`): the text went on
        through them undrafted, so what they say is older by a round. Without it, positions past γ kept another
        text's counts for good (seen only one round in 8-16, when γ explores one further): after edits, a chat
        that pays at γ 8 stayed at γ 3-4 through a dozen whole accepted rounds (docs/bench/adaptive.md#stale-depth)."""
        self.rounds += 1
        if self.carries:
            for i, p in enumerate(self.alphas(min(drafted, accepted + 1))):
                self.surprise += (1.0 if i < accepted else 0.0) - p
                self.spread += p * (1 - p)
        self._alphas.clear()
        # position i is reached iff all before it were accepted: i <= accepted; accepted iff i < accepted
        for i in range(min(drafted, accepted + 1)):
            while len(self.n) <= i:
                self.n.append(0.0)
                self.a.append(0.0)
            self.n[i] = decay * self.n[i] + 1.0
            self.a[i] = decay * self.a[i] + (1.0 if i < accepted else 0.0)
        if self.carries and drafted and accepted == drafted:
            for i in range(drafted, len(self.n)):
                self.n[i] *= decay
                self.a[i] *= decay
