"""Constraints (logit_bias, grammar) keep speculative sampling exact: with the target's rows and the drafter's
rows masked alike, the emitted tokens follow the *constrained* target distribution (χ² tests, as in
test_verify.py), and a draft the grammar forbids is never emitted. The grammar here is synthetic: which tokens
may follow depends on the previous token, like a real grammar's state.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest
from scipy import stats as sstats

from localspec.sampling.constrain import Constraint, ConstraintBroken
from localspec.sampling.logprobs import log_softmax, token_logprobs
from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import stack, warp
from localspec.speculative.verify import verify

V = 12
N = 20_000


class NextAllowed:
    """A synthetic grammar: after token t only tokens (t + j) % V for j in `steps` may follow."""

    def __init__(self, last: int, steps: Sequence[int] = (1, 2, 4, 7)) -> None:
        self.last, self.steps = last, tuple(steps)
        self.accepted: list[int] = []

    def mask(self) -> np.ndarray:
        m = np.zeros(V, dtype=bool)
        m[[(self.last + j) % V for j in self.steps]] = True
        return m

    def allows(self, token: int) -> bool:
        return (token - self.last) % V in self.steps

    def accept(self, token: int) -> None:
        assert self.allows(token), "accept() of a forbidden token (llama.cpp would abort)"
        self.last = token
        self.accepted.append(token)

    def clone(self) -> "NextAllowed":
        g = NextAllowed(self.last, self.steps)
        g.accepted = list(self.accepted)
        return g

    def close(self) -> None:
        pass


def _masked(p_logits: np.ndarray, mask: np.ndarray, params: SamplingParams) -> np.ndarray:
    z = p_logits.astype(np.float32).copy()
    z[~mask] = -np.inf
    return warp(z, params).dense(V)[0]


def _assert_matches(counts: np.ndarray, p: np.ndarray) -> None:
    keep = p > 0
    assert counts[~keep].sum() == 0, "emitted a token the constrained target gives probability 0"
    if keep.sum() == 1:  # one token left (top-p cut the rest): nothing more to test
        return
    chi2 = sstats.chisquare(counts[keep], p[keep] * counts.sum())
    assert chi2.pvalue > 0.01, f"χ² p-value {chi2.pvalue:.4f}: emitted distribution differs from constrained p"


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, top_k=3),
                                    SamplingParams(temperature=1.2, top_p=0.7)])
@pytest.mark.slow
def test_masked_target_and_drafter_keep_the_constrained_distribution(params: SamplingParams):
    """Position 0 and position 1 (after an accepted draft) both follow the masked, warped target rows."""
    rng = np.random.default_rng(7)
    context = [3]
    lp, lq = rng.normal(size=(3, V)) * 2, rng.normal(size=(2, V)) * 2
    c0, c1 = np.zeros(V), np.zeros(V)
    for _ in range(N):
        con = Constraint(V, grammar=NextAllowed(context[-1]))
        q0 = warp(con.row(lq[0], context, ()), params)  # the drafter's rows, masked as the target's
        d0 = q0.sample(rng)
        q1 = warp(con.row(lq[1], context, (d0,)), params)
        d1 = q1.sample(rng)
        P = warp(con.rows(lp, context, (d0, d1)), params)
        n_acc, nxt = verify(P, (d0, d1), stack([q0, q1]), rng)
        c0[d0 if n_acc > 0 else nxt] += 1
        if n_acc >= 1 and d0 == 4:  # condition on one first token: position 1's state is fixed
            c1[d1 if n_acc == 2 else nxt] += 1
    _assert_matches(c0, _masked(lp[0], NextAllowed(3).mask(), params))
    _assert_matches(c1, _masked(lp[1], NextAllowed(4).mask(), params))


def test_forbidden_lookup_draft_is_rejected_and_never_emitted():
    """A point-mass draft (prompt lookup) outside the grammar: p = 0 there, so it is always rejected."""
    rng = np.random.default_rng(10)
    params = SamplingParams(temperature=1.0)
    lp = rng.normal(size=(3, V))
    counts = np.zeros(V)
    for _ in range(5000):
        con = Constraint(V, grammar=NextAllowed(0))
        P = warp(con.rows(lp, [0], (3, 5)), params)  # 3 is not in {1, 2, 4, 7}
        n_acc, nxt = verify(P, (3, 5), None, rng)
        assert n_acc == 0
        counts[nxt] += 1
    _assert_matches(counts, _masked(lp[0], NextAllowed(0).mask(), params))


def test_rows_follow_the_draft_path_and_the_context():
    g = NextAllowed(0)
    con = Constraint(V, grammar=g)
    rows = con.rows(np.zeros((3, V)), [0], (1, 3))
    allowed = [set(np.flatnonzero(np.isfinite(r))) for r in rows]
    assert allowed == [{1, 2, 4, 7}, {2, 3, 5, 8}, {4, 5, 7, 10}]
    con.rows(np.zeros((1, V)), [0, 1, 3, 4], ())  # the loop accepted 1, 3 and the target's 4
    assert con.grammar.accepted == [1, 3, 4]
    with pytest.raises(ConstraintBroken):
        con.rows(np.zeros((1, V)), [0, 1, 3, 4, 4], ())  # 4 cannot follow 4


def test_rows_after_a_forbidden_draft_are_left_alone():
    con = Constraint(V, grammar=NextAllowed(0))
    rows = con.rows(np.zeros((3, V)), [0], (3, 4))  # 3 forbidden: rows 1, 2 are never read by verify
    assert np.isfinite(rows[0]).sum() == 4 and np.isfinite(rows[1:]).all()


def test_logit_bias_bans_and_boosts():
    con = Constraint(V, bias={2: -np.inf, 5: 100.0})
    rows = con.rows(np.zeros((2, V)), [0], (1,))
    assert np.isneginf(rows[:, 2]).all() and (rows.argmax(axis=1) == 5).all()
    p = warp(rows, SamplingParams(temperature=1.0)).dense(V)
    assert (p[:, 2] == 0).all() and np.allclose(p.sum(axis=1), 1.0)


def test_bias_that_bans_everything_falls_back_to_the_grammar():
    con = Constraint(V, bias={t: -np.inf for t in range(V)}, grammar=NextAllowed(0))
    row = con.row(np.zeros(V), [0], ())
    assert set(np.flatnonzero(np.isfinite(row))) == {1, 2, 4, 7}


def test_token_logprobs_are_the_raw_rows_log_softmax():
    rng = np.random.default_rng(9)
    rows = rng.normal(size=(2, V))
    out = token_logprobs(rows, [3, 7], 2)
    ls = log_softmax(rows[1])
    assert out[1].token == 7 and out[1].logprob == pytest.approx(ls[7])
    assert [t for t, _ in out[0].top] == list(np.argsort(-rows[0])[:2])
    assert np.exp(ls).sum() == pytest.approx(1.0)
    assert token_logprobs(rows, [3], None) == () and token_logprobs(rows, [3], 0)[0].top == ()


def test_greedy_rows_keep_the_best_allowed_token_without_a_full_mask():
    class Counting(NextAllowed):
        masks = 0

        def mask(self) -> np.ndarray:
            Counting.masks += 1
            return super().mask()

        def clone(self) -> "Counting":
            return Counting(self.last, self.steps)

    logits = np.arange(V, dtype=np.float32)[None].repeat(2, axis=0)  # 11 best, then 10, ...
    con = Constraint(V, grammar=Counting(0))  # after 0: {1, 2, 4, 7}; after 7: {8, 9, 11, 2}
    rows = con.rows(logits, [0], (7,), greedy=True)
    assert rows.argmax(axis=1).tolist() == [7, 11] and np.isfinite(rows).sum() == 2
    assert Counting.masks == 0
    full = con.rows(logits, [0], (7,))
    assert full.argmax(axis=1).tolist() == [7, 11]
