"""Choosing the draft length γ (k) each round, and switching speculation off when it does not pay.

The loop asks `choose_k()` before drafting (0 = decode plainly this round) and reports every round to
`observe(step)`. `FixedK` (fixed.py) is the plain policy. `Adaptive` keeps online estimates and picks the γ that
maximises expected tokens per unit of target time, rate(γ) = E(γ) / (γ·c + v(γ)) (the closed form: rate.py).

α_j is the acceptance at draft position j given positions < j were accepted (Beta counts with decay, so
it follows a change of content); c is drafter time per drafted token ÷ target single-token time (a model
drafter's fixed cost a round, f, is priced with v: round_cost.py); v(γ)
is target time for γ+1 rows ÷ one row (calibrated at load, refined from `Step.t_verify`: every round moves a
factor shared by the whole curve and, slowly, its own γ's point, so a calibration timed on a busy moment is
corrected at every γ within a few rounds).
Estimates are kept per draft source ("lookup", "model"), so a hybrid drafter can keep the free lookup
on while the model drafter is off; each source's cost c starts from what its drafter declares
(`Drafter.cost`: 0 for a free one, None = measured at load) and is refined online; its acceptance starts
from the prior its drafter declares (`Drafter.prior`), else from `alpha_prior`.

A source switches off when its best rate falls below `off_below` and back on above `on_above` (hysteresis).
Acceptance belongs to the text, so a request's first round weighs every free source's counts half (`_new_request`):
a session's estimate from one request's answers leans less on the next request's.
A drafter with a cost (a model, c ≥ `_C_FREE`) is measured before it is judged: it is on trial (trial.py) until its
rounds, as timed (round_cost.py), pin its acceptance down, at a draft length that grows with the evidence. Once on,
it switches off only when its rate at the acceptance's upper band (`KEEP_Z`) no longer beats plain decoding; if a
text turns it off, the next request tries it again; it is switched off only on a fresh t1, since a machine that
slowed since t1 was timed makes every cost look larger alike (machine.py). What the rounds measured is kept per
pair of files (acceptance.py), so the next run starts from it (docs/bench/adaptive.md#measured-before-judged).
A free source (prompt lookup) that has not drafted yet starts only above `on_above` too: its prior is an average
over tasks, and a failed first draft costs several steps. While off, a source is re-probed with a short draft,
the interval doubling while probes fail and probes taking at most `PROBE_SHARE` of the time, because a failed
probe of γ costs v(γ) - 1 steps. A free source that has not drafted is probed only if one fully accepted probe
would turn it on.
But while every source is off, no verify round corrects v(γ): a free source (lookup) is then still probed,
at most every `probe_max` rounds and within PROBE_SHARE, so a v calibrated on a busy moment cannot keep
speculation off for good (`_next_k`). The measurements behind these rules: docs/bench/lookup.md#source-probing.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..speculative.types import ControllerState
from .acceptance import Kept
from .estimate import SourceEstimate
from .machine import OFF_T1_FRESH, StepClock
from .rate import best_k, v_at
from .round_cost import catch_up_cost, catch_up_price, caught_up, learn_c, learn_draft_cost, round_cost, v_with_fixed
from .sources import K_MAX, K_MIN, family, off_reason
from .trial import TRIAL_RETRIES, TRIAL_Z, trial_over
from .verify_curve import VerifyCurve

if TYPE_CHECKING:
    from ..speculative.types import Step


PROBE_SHARE = 0.015  # at most this share of the time goes to probing a source that is off (if every probe fails)
# a drafter with a cost forgets more slowly than a free one: its acceptance belongs to the pair more than to the
# text, and γ chosen from ~20 decayed rounds flipped between neighbours on noise (3 % below the best fixed k in
# simulation, 1.5 % at this decay: docs/bench/adaptive.md#measured-before-judged)
DECAY_COSTLY = 0.98
EXPLORE_N = 8  # a drafter with a cost explores past γ twice as often while that position has fewer observations
SURPRISE_Z = 3.0  # a model drafter's counts fade when its rounds stray this many sd from what they predicted
KEEP_Z = 1.0  # a drafter with a cost that is on switches off once its rate at α + KEEP_Z sd falls below off_below
_C_UNKNOWN = 0.5  # a drafter cost nobody declared or measured: assume a drafted token costs half a target step
_C_FREE = 0.05  # a drafter this cheap (lookup) costs a probe nothing but its verify


class Adaptive:
    """Per-session adaptive γ with auto-off; see the module docstring for the model."""

    def __init__(self, *, sources: Sequence[str] = ("draft",), k_min: int = K_MIN, k_max: int = K_MAX,
                 v: Sequence[float] = (), t1: float | None = None, c: Mapping[str, float | None] | None = None,
                 prior: Mapping[str, tuple[float, ...]] | None = None, alpha_prior: float = 0.7,
                 decay: float = 0.95, cost_weight: float = 0.1,
                 off_below: float = 1.0, on_above: float = 1.1, warmup: int = 0,
                 probe_every: int = 64, probe_max: int = 256, probe_k: int | None = None,
                 learn_costs: bool = True, explore_every: int = 16, gammas: Sequence[int] = (),
                 kept: Mapping[str, Kept] | None = None) -> None:
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got {k_min}..{k_max}")
        self.k_min, self.k_max = k_min, k_max
        # the draft lengths to choose from: those calibration timed (costs.timed_gammas: v between them is
        # interpolated, and a batch that fills a kernel tile is cheaper than its neighbours), else every one
        timed = {g for g in gammas if k_min <= g <= k_max}
        self.gammas: frozenset[int] | None = frozenset(timed | {k_min, k_max}) if timed else None
        self.decay, self.w = decay, cost_weight
        self.off_below, self.on_above, self.warmup = off_below, on_above, warmup
        self.probe_every, self.probe_max = probe_every, probe_max
        self.probe_k = probe_k or 0  # 0: probe at the source's best γ
        self.alpha_prior = alpha_prior
        self._round_k: dict[str, int] = {}
        self.calibration: object | None = None  # the load-time Calibration, for reports
        self.clock = StepClock(t1)  # t1, the plain step every cost is a ratio to (machine.py); v: verify_curve.py
        self.explore_every = explore_every
        self.learn_costs = learn_costs  # False: keep the given v and c (tests, or a machine measured offline)
        seed = list(v) or [1.0 + 0.25 * d for d in range(k_max + 1)]  # a guess until measured
        self.curve = VerifyCurve(seed, k_max, cost_weight)
        c = dict(c or {})
        self.prior = dict(prior or {})  # source -> (α first, α later, …) a drafter declared (`Drafter.prior`)
        self.kept = dict(kept or {})  # source -> acceptance an earlier run of this pair measured (acceptance.py)
        self.src: dict[str, SourceEstimate] = {
            s: self._new_estimate(s, _C_UNKNOWN if (cs := c.get(s)) is None else cs) for s in sources}
        self.k_hist: Counter[int] = Counter()
        self.ctx = 0  # the context's length in tokens (a drafter that has not seen it catches up on it)
        for s in self.src:
            self._decide(s)

    # -- the Controller protocol --

    def choose_k(self) -> int:
        if self._t1_due():  # a plain round now: only plain rounds measure t1, against which every cost is a ratio
            self._round_k = dict.fromkeys(self.src, 0)
        else:
            self._round_k = {s: self._next_k(e) for s, e in self.src.items()}
        k = max(self._round_k.values(), default=0)
        self.k_hist[k] += 1
        return k

    @property
    def t1(self) -> float:
        """Seconds of a plain round, recently (machine.py)."""
        return self.clock.t1

    def _t1_due(self) -> bool:
        """Whether a plain round is due while a drafter with a cost drafts every round: only plain rounds time t1."""
        return self.learn_costs and self.clock.stale and any(e.on and e.c >= _C_FREE for e in self.src.values())

    def observe(self, step: "Step") -> None:
        if step.n_prompt:  # a request's first round: its content is new, and its depth another
            self._new_request()
            self.clock.expire()
            self.ctx = step.n_prompt + step.n_cached
        d = step.drafted
        if d and (seen := self.src.get(step.source or "draft")) is not None:
            seen.seen_to = self.ctx  # the drafter has decoded the context up to here
        self.ctx += len(step.tokens)
        if not self.learn_costs or step.t_verify <= 0:  # no verify timing: the pass also evaluated the prompt's tail
            if d:
                self._learn_alpha(step)
            return
        if d == 0:
            self._take_t1(step.t_verify)
            return
        self.clock.drafted()
        moved = self.curve.learn(d, step.t_verify / self.t1) if d <= self.k_max else False
        est = self._learn_alpha(step, decide=False)
        if caught_up(step, self.k_max):
            price = catch_up_price(step, est.c, self.t1, est.f or 0.0)
            est.catch_up = price if est.catch_up is None else 0.5 * (est.catch_up + price)
        elif est.c >= _C_FREE and self.k_max >= 2:
            learn_draft_cost(est, step, self.t1, self.w)
        else:
            learn_c(est, (step.t_draft / d) / self.t1, self.w)
        for source in self.src if moved else (step.source or "draft",):
            self._decide(source)

    def _take_t1(self, seconds: float) -> None:
        """A plain round's time. When the machine slowed (or sped up) as the verify rounds since the last plain round
        showed too, what those rounds taught was timed against a t1 the machine has left: every cost is expressed
        in the new one (machine.py), and every source decided again."""
        g = self.clock.plain(seconds, self.curve.scale)
        if g != 1.0:
            self.curve.rebase(g)
            for name, est in self.src.items():
                est.rebase(g)
                self._decide(name)
        self.clock.scale_at_t1 = self.curve.scale

    REQUEST_FADE = 0.5  # what a session's acceptance counts weigh when a new request's content begins

    def _new_request(self) -> None:
        """Acceptance is a property of the text, and a session's estimate carries it across requests: a server's
        SmolLM2-135M turned verbatim copies off on JSON answers, then drafted 9-42 tokens of rewrites whose answers
        copy 90 % of their tokens (docs/bench/adaptive.md#off-across-requests). So at a request's start every
        source's counts weigh `REQUEST_FADE` of what they did, nearer its prior, and each source is decided
        again; its own rounds in the new text then speak for it. A drafter with a cost (a model) fades so only while
        it drafts: SmolLM2-135M's Q4_0 copy is accepted 0.95 on edits and 0.6 on chat, and without the fade it drafted a
        whole chat answer at a loss after two edits. One that is off is left as it is: halving its counts would bring
        it back to its prior, which alone keeps it off (docs/bench/adaptive.md#measured-before-judged)."""
        for name, est in self.src.items():
            est.seen_to = 0
            est.surprise = est.spread = 0.0
            if est.rounds and est.c < _C_FREE:
                est.fade(self.REQUEST_FADE)
                self._decide(name)
            elif est.undecided or (est.switched_off and est.retries < TRIAL_RETRIES):
                # its trial spent its budget before the band decided, or it drafted and then turned itself off
                # (another text): a new trial, with half the budget of the try before, one a request
                if est.switched_off:
                    est.fade(self.REQUEST_FADE)
                est.trial, est.trial_loss, est.retries, est.switched_off = True, 0.0, est.retries + 1, False
                self._decide(name)
            elif est.rounds and est.on and not est.trial:  # drafting: the new text's rounds soon outweigh the last
                est.fade(self.REQUEST_FADE)
                self._decide(name)

    def _learn_alpha(self, step: "Step", decide: bool = True) -> SourceEstimate:
        name = step.source or "draft"
        est = self._estimate(name)
        if est.trial:  # what this round cost beyond what it gave
            est.trial_loss += self._round_cost(step, est) - (step.accepted + 1)
        if est.probe_due:  # the probe was drafted: the next one waits a doubled interval
            est.probe_due = False
            est.probe_every = min(2 * est.probe_every, self.probe_max)
        est.update(step.drafted, step.accepted, self.decay if est.c < _C_FREE else max(self.decay, DECAY_COSTLY))
        if est.surprised(SURPRISE_Z):  # another text than the counts came from: they weigh less (estimate.py)
            est.fade(self.REQUEST_FADE)
        if decide:
            self._decide(name)
        return est

    def _round_cost(self, step: "Step", est: SourceEstimate) -> float:
        """A drafted round's cost in target steps: as timed (round_cost.py) where costs are learnt, else as modelled.
        Counted at c·γ + v(γ), with the prompt's catch-up and one-token drafts' extra cost left out, a trial of
        SmolLM2-135M's Q4_0 copy ran its first prompt at 0.80-0.87× plain."""
        if not self.learn_costs:
            return step.drafted * est.c + v_at(self._v_of(est), step.drafted)
        return round_cost(step, est.c, self.t1, self._v_of(est), self.k_max, est.f or 0.0)

    def _catch_up_cost(self, est: SourceEstimate) -> float:
        """Target steps a drafter with a cost spends catching up before its next draft: every context token since it
        last drafted (a whole new prompt in a new request). A probe of SmolLM2-135M's copy, kept judged off, cost
        8-10 steps this way on a 126-token prompt (317-352 ms), where the probe rule counted under 1."""
        return catch_up_cost(est.catch_up, est.c, self.ctx - est.seen_to) if est.c >= _C_FREE else 0.0

    # -- per source --

    def k_for(self, source: str) -> int:
        """This round's draft length for one source (set by the last `choose_k()`): 0 = do not draft from it.
        A hybrid drafter asks this for each source it tries; a bucketed drafter asks for the bucket its match
        falls in. A bucket the controller was not told about ("lookup:long" when built with "lookup") starts
        from its family's cost and prior."""
        if source not in self._round_k and family(source) in self.src and source not in self.src:
            self._estimate(source)
            self._round_k[source] = self._next_k(self.src[source])
        return self._round_k.get(source, 0)

    def _estimate(self, source: str) -> SourceEstimate:
        """The estimate for `source`, made on first sight (c from its family when known)."""
        est = self.src.get(source)
        if est is None:
            fam = self.src.get(family(source))
            est = self.src[source] = self._new_estimate(source, fam.c if fam else _C_UNKNOWN)
            self._decide(source)
        return est

    def _new_estimate(self, source: str, c: float) -> SourceEstimate:
        """A source's estimate before any round: the prior its drafter declared, else the controller's."""
        first, *later = self.prior.get(source, (self.alpha_prior,))
        # off until the prior clears on_above, and then off like a source that switched off: first probe after
        # probe_every rounds; a drafter with a cost is on trial instead (trial.py)
        est = SourceEstimate(alpha_prior=first, later=tuple(later), c=c, on=False, probe_every=self.probe_every,
                             trial=c >= _C_FREE, carries=c >= _C_FREE)
        if (k := self.kept.get(source)) is not None:
            est.seed(k.n, k.a, k.rounds)
            est.trial = est.trial and not k.judged  # an earlier run's trial judged it: decide from its counts
            # ... starting from the state it was left in, so the hysteresis goes on from there: a pair that pays
            # 1.08× (Gemma-3-270M F16 + its Q4_0 copy) measured on, started off, would need on_above (1.1) to
            # draft again and never did
            est.on = k.judged and k.on
        return est

    def _next_k(self, est: SourceEstimate) -> int:
        """γ while on (every `explore_every` rounds γ+1, so v and α one position further stay measured);
        while off, a probe now and then at the γ it would use (the interval doubles while probes fail).
        A source that could not pay even at α = 1 is not probed: nothing a probe can learn about α would
        change that, and a model drafter's probe costs a catch-up prefill of everything since its last draft.
        Nor is one that has not drafted yet if a fully accepted probe would leave it off (`_probe_could_turn_on`)."""
        if est.on:
            est.since_probe += 1
            if est.since_probe >= self._explore_every(est) and est.k < self.k_max:
                est.since_probe = 0
                return self._longer(est.k)
            return est.k
        every = est.probe_every
        if est.hopeless:
            if not self._probes_v(est):
                return 0
            every = self.probe_max
        est.since_probe += 1
        if est.since_probe < every and not est.probe_due:
            return 0  # every round, for every source that is off: decided before any arithmetic
        k = self._probe_k(est)
        # a failed probe costs v(γ) - 1 + γc target steps: wait long enough that probing costs at most
        # PROBE_SHARE of the time (on a 2-core CPU, v(1) ≈ 2.3: a probe of SmolLM2-135M waits ~90 rounds)
        # ... and a model drafter's probe first catches up on the context it has not seen (`_catch_up_cost`)
        wait = max(every, (v_at(self._v_of(est), k) - 1 + k * est.c + self._catch_up_cost(est)) / PROBE_SHARE)
        if est.since_probe >= wait or est.probe_due:
            # due until the source actually drafts: a bucketed source (lookup by match length) is asked only
            # in rounds whose match falls in it, and a round it did not draft teaches nothing
            est.since_probe, est.probe_due = 0, True
            return k
        return 0

    def _explore_every(self, est: SourceEstimate) -> int:
        """Rounds between drafts one position longer than γ: `explore_every`, or half of it for a drafter with a
        cost while the position past γ has fewer than EXPLORE_N observations. A deep position seen a few times
        stayed where one unlucky rejection put it (Gemma-3-270M F16's Q4_0 copy: position 3 accepted 1 of 3, γ 2
        for the rest of the answer, where k = 4 paid 1.12×)."""
        n = est.n[est.k] if est.k < len(est.n) else 0.0
        return self.explore_every if est.c < _C_FREE or n >= EXPLORE_N else max(1, self.explore_every // 2)

    def _probes_v(self, est: SourceEstimate) -> bool:
        """Whether a hopeless source is probed anyway, for v(γ): it drafts for free and every source is hopeless,
        so no round would measure a verify otherwise."""
        return est.c < _C_FREE and all(e.hopeless for e in self.src.values())

    def _probe_k(self, est: SourceEstimate) -> int:
        """A probe's γ: the longest ≤ the source's best whose drafting costs at most one target step (long probes
        for a free drafter like lookup, short ones for an expensive model drafter), unless `probe_k` pins it."""
        return self.probe_k or max(self.k_min, min(est.k, int(1.0 / est.c) if est.c > 0 else est.k))

    def _longer(self, k: int) -> int:
        """The next draft length above k the controller chooses from."""
        return min((g for g in self.gammas if g > k), default=k) if self.gammas else k + 1

    @property
    def v(self) -> tuple[float, ...]:
        """v(0..k_max) as the controller now believes it (verify_curve.py)."""
        return self.curve.v

    def _v_of(self, est: SourceEstimate) -> tuple[float, ...]:
        """v(γ) as one source's rounds see it: its drafter's fixed cost a round added to every γ ≥ 1 (round_cost.py)."""
        return v_with_fixed(self.curve.v, est.f)

    def _decide(self, source: str) -> None:
        est = self.src[source]
        v = self._v_of(est)
        k, rate = best_k(est.alphas(self.k_max), est.c, v, self.k_min, self.k_max, self.gammas)
        est.k, est.rate = k, rate
        if est.trial and not self._trial_over(est):
            # γ grows with the evidence: at most one position past the deepest one observed, so a failed early draft
            # costs little
            est.k = min(k, next((i for i, n in enumerate(est.n) if n < 0.5), len(est.n)) + 1)
            est.on, est.reason, est.hopeless = True, None, False
            return
        threshold = self.on_above if not est.on else self.off_below
        if rate >= threshold or (est.on and est.rounds < self.warmup and rate >= 0.5 * self.off_below) \
                or (est.on and est.c >= _C_FREE and self._may_pay(est, KEEP_Z)):
            if not est.on:
                est.probe_every = self.probe_every
            est.on, est.reason, est.switched_off, est.paid = True, None, False, True
        else:
            if est.on and self._t1_first(est):
                return
            if est.on:
                est.since_probe, est.probe_every = 0, self.probe_every
                est.switched_off = est.c >= _C_FREE
            est.on = False
            est.reason = off_reason(source, est.alphas(k)[0], est.c, v_at(v, k), k, rate, measured=est.measured,
                                    full=best_k([1.0], est.c, v, self.k_min, self.k_max, self.gammas)[1])
            est.hopeless = (best_k([1.0], est.c, v, self.k_min, self.k_max, self.gammas)[1] < self.off_below
                            or (est.rounds == 0 and not self._probe_could_turn_on(est)))

    def _trial_over(self, est: SourceEstimate) -> bool:
        """Whether the trial has judged (trial.py): one that would judge a drafter off goes on until t1 is fresh.
        A try that judges it on gives back the session's tries (`TRIAL_RETRIES` bounds failures in a row, each
        paying a catch-up): Gemma-3-270M F16's copy went off on two break-even edit prompts and stayed off for
        the chat and rag prompts after them, where k = 4 paid 1.2× and 1.1×."""
        if not trial_over(est, self._rate_at(est), self.k_max, self.off_below):
            return False
        if not est.on and self._t1_first(est):
            est.trial, est.undecided = True, False
            return False
        if est.on and self._rate_at(est)(est.alphas_band(self.k_max, -TRIAL_Z)) >= self.off_below:
            est.retries = 0  # it clearly paid on this text: the tries count again from none
        return True

    def _t1_first(self, est: SourceEstimate) -> bool:
        """Whether a drafter with a cost must wait for a plain round before it is switched off, and if so ask for
        one: every cost is a ratio to t1, and a machine that slowed since t1 was timed inflates them all alike
        (machine.py)."""
        if est.c < _C_FREE or not self.learn_costs or self.clock.timed_since < OFF_T1_FRESH:
            return False
        self.clock.expire()
        return True

    def _may_pay(self, est: SourceEstimate, z: float) -> bool:
        """Whether the best rate at acceptance z standard deviations above its estimate still beats plain decoding:
        a drafter with a cost that is on stays on until its rounds show, not merely suggest, that it loses (its
        estimate rests on about 20 decayed rounds, and a noisy dip would switch off a drafter that pays)."""
        return best_k(est.alphas_band(self.k_max, z), est.c, self._v_of(est), self.k_min, self.k_max,
                      self.gammas)[1] >= self.off_below

    def _rate_at(self, est: SourceEstimate) -> Callable[[Sequence[float]], float]:
        """The best rate this source's costs give at a list of acceptances (trial.py asks it at the band's ends)."""
        v = self._v_of(est)
        return lambda alphas: best_k(alphas, est.c, v, self.k_min, self.k_max, self.gammas)[1]

    def _probe_could_turn_on(self, est: SourceEstimate) -> bool:
        """Whether one probe (`_probe_k`), every token accepted, would turn this source on. For a source that has not
        drafted, all the controller knows is its prior (an average over tasks); a probe pays only by changing the
        decision, so one that could not, even at its best outcome, is not made (docs/bench/lookup.md#source-probing).
        A source that has drafted keeps being re-probed
        with backoff: its rounds say more than the prior, and what it drafts on may have changed since."""
        k = self._probe_k(est)
        after = replace(est, n=list(est.n), a=list(est.a))
        after.update(k, k, self.decay)
        return best_k(after.alphas(self.k_max), est.c, self._v_of(est), self.k_min, self.k_max,
                      self.gammas)[1] >= self.on_above

    def measurements(self) -> dict[str, Kept]:
        """Each source's acceptance counts as its rounds left them, to keep for the pair's next run. Off is kept as
        a judgement only for a source that was never on this session: one that paid on some texts and ended off on
        another is tried again by the next run, which may begin with a text it pays on. SmolLM2-135M F32's copy
        drafted code and edits (1.01-1.11 of k = 2), ended off on chat and rag, and the next run, resuming off
        just under `on_above`, drafted nothing: 0.95 of k = 2 (docs/bench/adaptive.md#stale-depth)."""
        now = time.time()
        return {s: Kept(tuple(e.n), tuple(e.a), e.rounds, now,
                        judged=not (e.trial or e.undecided or e.switched_off or (e.paid and not e.on)), on=e.on)
                for s, e in self.src.items() if e.measured}

    # -- reporting --

    @property
    def spec_disabled_reason(self) -> str | None:
        """Why speculation is off now, or None while some source still drafts."""
        if any(e.on for e in self.src.values()):
            return None
        return "; ".join(e.reason for e in self.src.values() if e.reason) or None

    @property
    def _label(self) -> str:
        return "auto" if self.k_min < self.k_max else str(self.k_min)

    def policy(self) -> tuple[str, int]:
        return self._label, max((e.k if e.on else 0 for e in self.src.values()), default=0)

    def state(self) -> ControllerState:
        k = {s: (e.k if e.on else 0) for s, e in self.src.items()}
        label = self._label
        return ControllerState(
            adaptive=True, k_chosen=dict(self.k_hist), c={s: e.c for s, e in self.src.items()},
            v=tuple(self.v), alpha={s: tuple(e.alphas(self.k_max)) for s, e in self.src.items()},
            k=k, rate={s: e.rate for s, e in self.src.items()},
            spec_disabled_reason=self.spec_disabled_reason,
            off={s: e.reason for s, e in self.src.items() if not e.on and e.reason},
            label=label, k_now=max(k.values(), default=0))
