"""What one draft source has shown so far: per-position acceptance as decayed Beta counts over a prior, and its
cost c, with the γ controller's state for the source (on or off, its γ and rate, probing). The controller
(controller.py) keeps one per source and decides from it; the counting lives here."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceEstimate:
    """What one draft source has shown: per-position acceptance (decayed Beta counts) and its cost c."""

    alpha_prior: float = 0.7  # prior acceptance of the first draft position ...
    alpha_next: float | None = None  # ... and of each later one (None: each leans on the position before it)
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

    def alphas(self, k: int, prior_n: float = 2.0) -> list[float]:
        """α_1..α_k: each position's counts over its prior, which is `alpha_prior` for the first and
        `alpha_next` for the rest when the drafter declared one, else the estimate of the position before."""
        out: list[float] = []
        prev = self.alpha_prior
        for i in range(k):
            n = self.n[i] if i < len(self.n) else 0.0
            a = self.a[i] if i < len(self.a) else 0.0
            prior = prev if i == 0 or self.alpha_next is None else self.alpha_next
            prev = (a + prior_n * prior) / (n + prior_n)
            out.append(prev)
        return out

    def update(self, drafted: int, accepted: int, decay: float) -> None:
        self.rounds += 1
        # position i is reached iff all before it were accepted: i <= accepted; accepted iff i < accepted
        for i in range(min(drafted, accepted + 1)):
            while len(self.n) <= i:
                self.n.append(0.0)
                self.a.append(0.0)
            self.n[i] = decay * self.n[i] + 1.0
            self.a[i] = decay * self.a[i] + (1.0 if i < accepted else 0.0)
