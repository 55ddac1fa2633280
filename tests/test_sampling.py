"""warp's candidate cuts are exact (including their fallbacks), penalties follow each row's history, and the
sparse `Warped` rows behave as the dense distributions they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import Warped, stack, warp


def reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """llama.cpp's chain written from its definition over the whole (sorted) vocabulary, no penalties."""
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    lg = logits[order].astype(np.float64)
    n = len(lg)
    if params.top_k:
        n = min(n, params.top_k)
    if params.top_p < 1.0:
        e = np.exp(lg[:n] - lg[0])
        n = min(n, int(np.searchsorted(np.cumsum(e) / e.sum(), params.top_p)) + 1)
    if params.min_p > 0.0:
        n = min(n, int(np.count_nonzero(logits[order[:n]] >= logits[order[0]] + np.float32(np.log(params.min_p)))))
    p = np.exp((lg[:n] - lg[0]) / params.temperature)
    out = np.zeros(len(lg))
    out[order[:n]] = p / p.sum()
    return out


def _check(logits: np.ndarray, params: SamplingParams) -> None:
    got = warp(logits, params).dense(logits.shape[-1])
    want = np.stack([reference(row, params) for row in np.atleast_2d(logits)])
    assert np.array_equal(got > 0, want > 0)
    assert np.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=0.5, top_p=0.5),
    SamplingParams(temperature=1.2, top_p=0.999),
    SamplingParams(temperature=0.9, min_p=0.2),
    SamplingParams(temperature=1.1, top_p=0.9, min_p=0.001),
    SamplingParams(temperature=1.0),
])
def test_warp_equals_the_definition_over_rows_and_vocab_sizes(params: SamplingParams):
    rng = np.random.default_rng(0)
    for V in (7, 500, 70_000):
        _check((rng.gumbel(size=(3, V)) * 2).astype(np.float32), params)


def test_top_k_falls_back_when_the_sample_misses():
    """All leaders sit on the strided sample's positions: its estimate is above the k-th largest; the exact
    k-th largest must take over."""
    V, k = 200_000, 300
    logits = np.zeros((2, V), dtype=np.float32)
    stride = V // 2048
    logits[:, : k * stride: stride] = np.linspace(10, 5, k)
    logits[1] += np.random.default_rng(1).normal(size=V).astype(np.float32) * 0.01
    _check(logits, SamplingParams(temperature=1.0, top_k=k))


def test_top_p_alone_falls_back_to_the_whole_vocabulary():
    """One leader, and a long tail just under p_max × 1e-8 that holds more than 1 - top_p of the mass: no eps
    cut reaches top_p, the nucleus is the whole vocabulary."""
    V = 70_000
    logits = np.full((2, V), np.log(0.9e-8), dtype=np.float32)
    logits[:, 0] = 0.0
    logits[1] += np.random.default_rng(2).normal(size=V).astype(np.float32) * 0.01
    _check(logits, SamplingParams(temperature=0.7, top_p=0.9999))


def test_greedy_is_argmax_and_rows_keep_their_own_argmax():
    logits = np.array([[0.1, 3.0, 2.0], [5.0, 1.0, 4.0]], dtype=np.float32)
    w = warp(logits, SamplingParams())
    assert w.ids[:, 0].tolist() == [1, 0] and w.probs.tolist() == [[1.0], [1.0]]


def test_penalty_semantics_divide_positive_multiply_negative():
    logits = np.array([2.0, 1.9, -1.0, -1.1, 0.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, repeat_penalty=2.0)
    got = warp(logits, params, [0, 2, 0]).dense(5)[0]
    want = np.exp(np.array([1.0, 1.9, -2.0, -1.1, 0.0]))
    assert np.allclose(got, want / want.sum())
    greedy = SamplingParams(repeat_penalty=2.0)
    assert warp(logits, greedy, [0]).ids[0, 0] == 1  # argmax of the penalised row
    assert warp(logits, greedy, [4, 4]).ids[0, 0] == 0
    assert warp(logits, SamplingParams(repeat_penalty=2.0, repeat_last_n=1), [0, 4]).ids[0, 0] == 0  # window 1


def test_presence_and_frequency_penalties_subtract_per_window():
    logits = np.zeros(4, dtype=np.float32)
    params = SamplingParams(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.25, repeat_last_n=3)
    got = warp(logits, params, [1, 2, 2, 3, 3]).dense(4)[0]  # window [2, 3, 3]
    want = np.exp([0.0, 0.0, -0.75, -1.0])
    assert np.allclose(got, want / want.sum())


def test_verify_rows_see_the_drafts_before_them_and_logits_are_left_as_they_were():
    rng = np.random.default_rng(3)
    V = 3000
    rows = (rng.gumbel(size=(4, V)) * 2).astype(np.float32)
    before = rows.copy()
    context, drafts = rng.integers(0, V, 50).tolist(), [int(np.argmax(rows[i + 1])) for i in range(3)]
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.8, repeat_last_n=5)
    together = warp(rows, params, context, drafts).dense(V)
    assert np.array_equal(rows, before)
    for i in range(4):
        alone = warp(rows[i], params, context + drafts[:i]).dense(V)[0]
        assert np.array_equal(together[i] > 0, alone > 0) and np.allclose(together[i], alone, atol=1e-15)
    assert together[2, drafts[1]] < warp(rows[2], params, context).dense(V)[0, drafts[1]]  # penalised


def test_penalty_needs_the_drafts_of_every_row():
    with pytest.raises(ValueError, match="drafts"):
        warp(np.zeros((3, 10), dtype=np.float32), SamplingParams(repeat_penalty=1.1), [1, 2], [3])


def test_read_only_logits_are_accepted():
    logits = np.arange(10, dtype=np.float32)
    logits.flags.writeable = False
    assert warp(logits, SamplingParams(repeat_penalty=5.0), [9]).ids[0, 0] == 8


def test_warped_lookups_stack_and_sampling():
    a = Warped(np.array([[4, 1, -1]]), np.array([[0.75, 0.25, 0.0]]))
    b = Warped(np.array([[2]]), np.array([[1.0]]))
    w = stack([a, b])
    assert w.ids.tolist() == [[4, 1, -1], [2, -1, -1]]
    assert w.prob([1, 2]).tolist() == [0.25, 1.0]
    assert w.at(0, np.array([1, 2, 4, -1])).tolist() == [0.25, 0.0, 0.75, 0.0]
    rng = np.random.default_rng(4)
    draws = [w.sample(rng, 0) for _ in range(4000)]
    assert set(draws) == {1, 4} and abs(draws.count(4) / 4000 - 0.75) < 0.03
    assert w.dense(5).tolist() == [[0, 0.25, 0, 0, 0.75], [0, 0, 1.0, 0, 0]]


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(min_p=2),
                                dict(repeat_penalty=0), dict(repeat_last_n=-2), dict(presence_penalty=float("nan"))])
def test_bad_params_are_refused(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_the_warped_rows_are_as_small_as_what_survives():
    """The sparse form is the point: at Gemma's vocabulary, llama.cpp's defaults leave at most top-k columns, and
    a pass of several rows is cut together."""
    logits = (np.random.default_rng(5).gumbel(size=(5, 262_144)) * 2.5).astype(np.float32)
    w = warp(logits, SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), list(range(64)), [1, 2, 3, 4])
    assert len(w) == 5 and w.ids.shape[1] <= 40
    assert np.allclose(w.probs.sum(axis=1), 1.0)


@pytest.mark.parametrize("kw", [dict(frequency_penalty=-1e308), dict(repeat_penalty=1e-300),
                                dict(repeat_penalty=1e300), dict(presence_penalty=1e308),
                                dict(presence_penalty=-3e38, frequency_penalty=3e38)])
def test_extreme_penalties_keep_every_logit_finite_and_sampling_works(kw):
    """A penalty that overflows float32 must not turn softmax into NaN (a server found one with a fuzzer)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 500)).astype(np.float32)
    w = warp(logits, SamplingParams(temperature=0.8, **kw), history=[1, 2, 3], drafts=[4])
    assert np.isfinite(w.probs).all() and np.allclose(w.probs.sum(axis=1), 1.0)
    assert 0 <= w.sample(rng, 0) < 500 and 0 <= w.sample(rng, 1) < 500


@pytest.mark.parametrize("t", [float("nan"), float("inf")])
def test_a_temperature_that_is_not_a_finite_number_is_refused(t):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=t)
