"""End to end through the speculative loop: sampled output follows the target's own distribution, with and
without the repetition penalty, for a point-mass drafter (prompt lookup) and a model drafter (χ² tests).

The fake models give real distributions (a bigram table: logits depend on the last token), so the penalty
changes the second token's distribution according to the first, and the drafts must carry that history.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeModel
from scipy import stats as sstats

from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import warp
from localspec.speculative.drafters import ModelDrafter, PromptLookup
from localspec.speculative.loop import generate
from localspec.tuning.fixed import FixedK

pytestmark = pytest.mark.slow

V = 6  # token 0 is EOS: logit -inf, never emitted
N = 3000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # lookup proposes 3, 1, 2, ...


class BigramModel(FakeModel):
    """Logits of each row are table[token of that row]."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__(lambda ctx: 1, n_vocab=table.shape[1])
        self.table = table

    def decode(self, tokens, logits_rows=1):
        super().decode(tokens, logits_rows)  # cache bookkeeping and overflow checks
        return self.table[list(tokens)[len(tokens) - logits_rows:]].copy()


def _table(seed: int) -> np.ndarray:
    t = np.random.default_rng(seed).normal(size=(V, V)).astype(np.float32)
    t[:, 0] = -np.inf
    return t


def _plain_joint(table: np.ndarray, params: SamplingParams) -> np.ndarray:
    """P(first, second) of plain decoding: each token from the warp of its own history."""
    p0 = warp(table[PROMPT[-1]], params, PROMPT).dense(V)[0]
    joint = np.zeros((V, V))
    for a in np.flatnonzero(p0):
        joint[a] = p0[a] * warp(table[a], params, PROMPT + [a]).dense(V)[0]
    return joint


PARAMS = [SamplingParams(temperature=0.9, top_k=4, top_p=0.95),
          SamplingParams(temperature=0.9, top_k=4, top_p=0.95, repeat_penalty=2.5, repeat_last_n=3),
          SamplingParams(temperature=1.2, min_p=0.05, repeat_penalty=0.5, presence_penalty=0.3, repeat_last_n=2)]


@pytest.mark.parametrize("drafter", ["lookup", "model", "model-independent"])
@pytest.mark.parametrize("params", PARAMS, ids=["plain", "penalty", "penalty-below-1"])
def test_first_two_tokens_follow_plain_decoding(drafter: str, params: SamplingParams):
    table = _table(0)
    target = BigramModel(table)
    d = (PromptLookup() if drafter == "lookup" else  # the same-seed rule; coupled model drafts: the same rule;
         ModelDrafter(BigramModel(_table(1)), draw="coupled" if drafter == "model" else "independent"))  # rejection
    rng = np.random.default_rng(42)
    counts = np.zeros((V, V))
    drafted = 0
    for _ in range(N):
        out: list[int] = []
        for step in generate(target, PROMPT, drafter=d, params=params, controller=FixedK(3),
                             max_tokens=3, rng=rng):
            out += step.tokens
            drafted += step.drafted
        counts[out[0], out[1]] += 1
    want = _plain_joint(table, params)
    keep = want > 0
    assert drafted >= 2 * N and counts[~keep].sum() == 0  # first rounds draft 2: row 1 sees drafts[:1]
    chi2 = sstats.chisquare(counts[keep], want[keep] * N)
    assert chi2.pvalue > 0.01, f"χ² p-value {chi2.pvalue:.4f}: speculative output differs from plain decoding"


def test_the_penalty_changes_the_distribution():
    """Sanity for the test above: with the penalty, the plain joint differs from the unpenalised one."""
    table = _table(0)
    assert np.abs(_plain_joint(table, PARAMS[0]) - _plain_joint(table, PARAMS[1])).max() > 0.05
