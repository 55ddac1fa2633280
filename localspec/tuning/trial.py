"""A model drafter's trial: drafting to measure its acceptance before it is judged (controller.py decides the
rest). The trial ends when the best rate is on the same side of plain decoding at both ends of the acceptance's
credible band (±TRIAL_Z standard deviations of each position's Beta posterior), when even full acceptance could not
pay, or when its rounds have cost TRIAL_BUDGET target steps more than they gave; then the estimate as it stands
decides, and a trial the budget ended inside the band is undecided: the next request tries again with half the
budget of the try before (at most twice TRIAL_BUDGET for a drafter that never pays, at most TRIAL_RETRIES tries
more in a row), and what it keeps is no judgement, so the next run tries too: one unlucky first answer settled
pairs that pay 1.06-1.25× as off for good. Besides its budget, each try pays once for the drafter to catch up on
the prompt (its prefill: ~5 % of a 128-token answer for SmolLM2-135M's Q4_0 copy). Only a drafter that could not
pay even if every draft were accepted skips the trial. The measurements: docs/bench/adaptive.md#measured-before-judged.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .estimate import SourceEstimate

TRIAL_Z = 2.0  # the credible band a trial must leave: the posterior mean ± this many standard deviations
# a trial stops after costing this many target steps beyond what it gave: 3 % of a 128-token answer's plain time
TRIAL_BUDGET = 0.03 * 128
# an undecided trial tries again at most this many times in a row, at a request's start: each try of a model drafter
# first catches up on the prompt (6.5 target steps for SmolLM2-135M's Q4_0 copy on a 126-token prompt), which no
# budget can halve; after the last one the estimate as it stands judges. A try that clearly pays gives the tries back
# (controller `_trial_over`)
TRIAL_RETRIES = 2


def trial_over(est: SourceEstimate, rate_at: Callable[[Sequence[float]], float], k_max: int,
               off_below: float) -> bool:
    """Whether a source on trial is known well enough to judge; when it is, leave `est.on` as the trial found it,
    for the ordinary decision (with its hysteresis) to take over. `rate_at(alphas)` is the best rate at those
    acceptances. Known enough: the best rate is on the same side of `off_below` at both ends of the acceptance's
    credible band, so more rounds would not change the decision; or even full acceptance could not pay; or the trial
    has cost its budget, and then the estimate as it stands decides."""
    est.trial, est.undecided = False, False
    if rate_at([1.0]) < off_below:
        est.on = False
    elif rate_at(est.alphas_band(k_max, -TRIAL_Z)) >= off_below:
        est.on = True
    elif rate_at(est.alphas_band(k_max, TRIAL_Z)) < off_below:
        est.on = False
    elif est.trial_loss >= TRIAL_BUDGET * 0.5 ** est.retries:
        est.on, est.undecided = est.rate >= off_below, est.retries < TRIAL_RETRIES
    else:
        est.trial = True
    return not est.trial
