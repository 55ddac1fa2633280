"""verify() against exact synthetic distributions: the emitted token is distributed as p (χ² test).

The first emitted token of a round is d_0 if accepted, else the residual draw (rejection sampling) or the target's
own sample (the same-seed rule); its marginal must be p_0. The same-seed rule must also emit, draw for draw, what
plain decoding emits from the same RNG state, whatever the draft.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sstats

from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import Warped, stack, warp
from localspec.speculative.drafters import peek
from localspec.speculative.verify import residual, verify, verify_greedy, verify_rejection, verify_same_seed

V = 12
N = 20_000


def _dist(rng: np.random.Generator, sharp: float = 1.0) -> np.ndarray:
    x = rng.gamma(sharp, size=V)
    return x / x.sum()


def sparse(dense: np.ndarray, rng: np.random.Generator | None = None) -> Warped:
    """Dense rows [n, V] as `Warped`: only the nonzero entries, in a shuffled order, padded with -1."""
    rows = []
    for row in np.atleast_2d(dense):
        ids = np.flatnonzero(row)
        if rng is not None:
            ids = rng.permutation(ids)
        rows.append(Warped(ids[None], row[ids][None]))
    return stack(rows)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    return int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"))


def _first_token_counts(p: np.ndarray, q: np.ndarray | None, rng: np.random.Generator,
                        k: int = 3) -> tuple[np.ndarray, float]:
    """Run N rounds with drafts drawn from q (or the point mass argmax q); count the first emitted token."""
    counts = np.zeros(V)
    accepted0 = 0
    P = sparse(np.stack([p] * (k + 1)), rng)
    Q = None if q is None else sparse(np.stack([q] * k), rng)
    point = int(np.argmax(q)) if q is None else None
    for _ in range(N):
        if Q is None:
            draft = [point] * k
        else:
            draft = [sample(q, rng) for _ in range(k)]
        n_acc, nxt = verify(P, draft, Q, rng)
        first = draft[0] if n_acc > 0 else nxt
        counts[first] += 1
        accepted0 += n_acc > 0
    return counts, accepted0 / N


def _assert_matches(counts: np.ndarray, p: np.ndarray) -> None:
    keep = p > 0
    assert counts[~keep].sum() == 0, "emitted a token the target gives probability 0"
    expected = p[keep] * counts.sum()
    chi2 = sstats.chisquare(counts[keep], expected)
    assert chi2.pvalue > 0.01, f"χ² p-value {chi2.pvalue:.4f}: emitted distribution differs from p"


def test_model_drafter_distribution_matches_target():
    rng = np.random.default_rng(0)
    p, q = _dist(rng), _dist(rng, 0.5)
    counts, acc = _first_token_counts(p, q, rng)
    _assert_matches(counts, p)
    assert acc == pytest.approx(np.minimum(p, q).sum(), abs=0.015)  # acceptance = Σ min(p, q)


def test_point_mass_drafter_distribution_matches_target():
    """The same-seed rule (q = None) on a point-mass draft: output ~ p, acceptance p(d)."""
    rng = np.random.default_rng(1)
    p = _dist(rng)
    q_point = np.zeros(V)
    q_point[3] = 1.0
    counts = np.zeros(V)
    acc = 0
    P = sparse(np.stack([p] * 3))
    for _ in range(N):
        n_acc, nxt = verify(P, [3, 3], None, rng)
        first = 3 if n_acc > 0 else nxt
        counts[first] += 1
        acc += n_acc > 0
    _assert_matches(counts, p)
    assert acc / N == pytest.approx(np.minimum(p, q_point).sum(), abs=0.015)  # = p(3)


def _plain(P: Warped, rng: np.random.Generator, n: int) -> list[int]:
    """Plain decoding's n tokens: one row at a time, each warped on its own (a 1-row Warped), one draw each."""
    return [Warped(P.ids[i:i + 1], P.probs[i:i + 1]).sample(rng, 0) for i in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_same_seed_rule_emits_plain_decodings_tokens(seed: int):
    """Whatever the draft (right, wrong, partly right), the tokens emitted and the RNG state after them are
    plain decoding's from the same state: one draw per emitted token, from the same rows."""
    rng = np.random.default_rng(seed)
    P = sparse(np.stack([_dist(rng, 0.4) for _ in range(5)]), rng)
    want = _plain(P, np.random.default_rng(seed + 100), 5)
    for draft in ([], want[:4], want[:2] + [(want[2] + 1) % V, want[3]], [(want[0] + 1) % V] * 3, want[:1]):
        r = np.random.default_rng(seed + 100)
        n, nxt = verify_same_seed(P, draft, r)
        emitted = list(draft[:n]) + [nxt]
        assert emitted == want[:n + 1]
        after = np.random.default_rng(seed + 100)
        for _ in range(n + 1):
            after.random()
        assert r.random() == after.random()  # the stream moved by exactly one draw per emitted token


def test_same_seed_rule_is_the_exact_target_distribution():
    """χ² on the joint of the first two emitted tokens: drafts from lookup-like point masses that are sometimes
    right, against the exact p_0 × p_1 (row 1 is used only after d_0 was accepted)."""
    rng = np.random.default_rng(11)
    p0, p1 = _dist(rng), _dist(rng)
    P = sparse(np.stack([p0, p1, _dist(rng)]), rng)
    counts = np.zeros((V, V))
    for _ in range(N):
        d0, d1 = int(np.argmax(p0)), int(rng.integers(V))
        out: list[int] = []
        n, nxt = verify_same_seed(P, [d0, d1], rng)
        out = [d0, d1][:n] + [nxt]
        if len(out) == 1:  # a second round from the next position: plain draw from p1
            out.append(Warped(P.ids[1:2], P.probs[1:2]).sample(rng, 0))
        counts[out[0], out[1]] += 1
    _assert_matches(counts.ravel(), np.outer(p0, p1).ravel())


def test_coupled_model_draft_is_exact_and_plain_decodings_text():
    """A model draft drawn at the uniforms the target will draw (drafters.peek; ModelDrafter's default):
    verified by the same-seed rule its output is plain decoding's token for token, so exactly p (χ²), and it
    is accepted about as often as rejection sampling's Σ min(p, q) when q is close to p."""
    rng = np.random.default_rng(12)
    p = _dist(rng)
    q = 0.8 * p + 0.2 * _dist(rng)
    P = sparse(np.stack([p] * 4))  # ascending ids, as warp writes them: the order q and p are walked in
    Q = sparse(np.stack([q] * 3))
    counts = np.zeros(V)
    acc = 0
    for _ in range(N):
        u = peek(rng, 3)
        draft = [Q.pick(i, u[i]) for i in range(3)]
        state = rng.bit_generator.state
        n, nxt = verify_same_seed(P, draft, rng)
        plain = np.random.default_rng()
        plain.bit_generator.state = state
        assert list(draft[:n]) + [nxt] == _plain(P, plain, n + 1)
        counts[draft[0] if n else nxt] += 1
        acc += n > 0
    _assert_matches(counts, p)
    assert acc / N > 0.7 * np.minimum(p, q).sum()


def test_rows_sample_alike_whatever_their_neighbours():
    """A row warped inside a verify block and the same row warped alone hold the same candidates in the same
    (ascending id) order, ties included, so one uniform picks the same token from both."""
    rng = np.random.default_rng(13)
    for params in (SamplingParams(temperature=0.8, top_k=5), SamplingParams(temperature=0.8, top_k=5, top_p=0.7),
                   SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.7, min_p=0.05),
                   SamplingParams(temperature=0.9)):
        logits = np.round(rng.normal(size=(4, 300)) * 3, 1).astype(np.float32)  # rounded: ties at the cuts
        block = warp(logits, params)
        for i in range(4):
            alone = warp(logits[i], params)
            ids = block.ids[i][block.ids[i] >= 0]
            assert ids.tolist() == alone.ids[0][alone.ids[0] >= 0].tolist()
            assert (np.diff(ids) > 0).all()
            for u in rng.random(50):
                assert block.pick(i, u) == alone.pick(0, u)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=6),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05),
])
def test_warped_distributions_are_preserved(params: SamplingParams):
    """Temperature/top-k/top-p/min-p applied identically to target and drafter logits; output ~ warped p."""
    rng = np.random.default_rng(2)
    p = warp(rng.normal(size=V) * 2, params).dense(V)[0]
    q = warp(rng.normal(size=V) * 2, params).dense(V)[0]
    counts, acc = _first_token_counts(p, q, rng)
    _assert_matches(counts, p)
    assert acc == pytest.approx(np.minimum(p, q).sum(), abs=0.015)


def test_later_positions_also_follow_p():
    """Second emitted token, conditioned on the first draft being accepted, is distributed as p_1."""
    rng = np.random.default_rng(3)
    p0, p1, q0, q1 = _dist(rng), _dist(rng), _dist(rng), _dist(rng, 0.3)
    P, Q = sparse(np.stack([p0, p1, _dist(rng)])), sparse(np.stack([q0, q1]))
    counts = np.zeros(V)
    for _ in range(N):
        draft = [sample(q0, rng), sample(q1, rng)]
        n_acc, nxt = verify(P, draft, Q, rng)
        if n_acc >= 1:
            counts[draft[1] if n_acc == 2 else nxt] += 1
    _assert_matches(counts, p1)


def test_bonus_token_when_all_accepted():
    p = sparse(np.eye(V)[[1, 2, 7]])  # target certain of 1, 2, then 7
    n, nxt = verify(p, [1, 2], None, np.random.default_rng(0))
    assert (n, nxt) == (2, 7)
    q = sparse(np.eye(V)[[1, 2]])
    assert verify_rejection(p, [1, 2], q, np.random.default_rng(0)) == (2, 7)


def test_residual_lives_on_p_support():
    p = sparse(np.array([[0.5, 0.3, 0.2, 0.0]]))
    q = sparse(np.array([[0.6, 0.1, 0.0, 0.3]]))
    assert residual(p, 0, 0, q).dense(4)[0].tolist() == pytest.approx([0.0, 0.5, 0.5, 0.0])
    assert residual(p, 0, 1, None).dense(4)[0].tolist() == pytest.approx([5 / 7, 0.0, 2 / 7, 0.0])


def test_disjoint_candidate_sets_are_exact():
    """p and q cut to different candidates (as top-k/top-p do on different logits): q's tokens outside p's
    support are always rejected and the output still follows p."""
    rng = np.random.default_rng(5)
    p, q = _dist(rng), _dist(rng)
    p[6:] = 0.0
    q[:3] = 0.0
    p, q = p / p.sum(), q / q.sum()
    counts, acc = _first_token_counts(p, q, rng)
    _assert_matches(counts, p)
    assert acc == pytest.approx(np.minimum(p, q).sum(), abs=0.015)


def test_greedy_verify():
    assert verify_greedy([5, 6, 7, 8], [5, 6, 9]) == (2, 7)
    assert verify_greedy([5, 6, 7, 8], [5, 6, 7]) == (3, 8)
    assert verify_greedy([4], []) == (0, 4)
