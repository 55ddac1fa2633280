"""llama.cpp's infill sampler (sampling/infill.py): hand-made candidates for each rule, then the warp against
llama.cpp's own `top_k, top_p, infill, dist` chain on SmolLM2's vocabulary (through llama-cpp-python)."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import llama_cpp
import numpy as np
import pytest

from localspec.sampling.infill import Infill, keep_set
from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import greedy, warp

# a toy vocabulary: 0 = EOS, 1 = EOT (both EOG), then text pieces
PIECES = {0: b"", 1: b"", 2: b"ret", 3: b"return", 4: b"x", 5: b"y", 6: b"z", 7: b"retu", 8: b"w"}
TOY = Infill(piece=PIECES.__getitem__, is_eog=lambda t: t in (0, 1), eot=1)


def _keep(probs: dict[int, float]) -> set[int] | None:
    ids = list(probs)
    mask = keep_set(np.log(np.array([probs[i] for i in ids])), ids, TOY)
    return None if mask is None else {ids[i] for i in np.flatnonzero(mask)}


def test_eog_wins_when_three_n_p_eog_beats_the_text():
    # n = 4: 3 × 0.1 × 4 = 1.2 > 0.9 -> only the EOG tokens stay
    assert _keep({0: 0.1, 4: 0.5, 5: 0.3, 6: 0.1}) == {0}
    # 3 × 0.05 × 4 = 0.6 < 0.95 -> text goes on: x 0.6 and y 0.22 pass 0.2, then y 0.25 (of 0.87) < 1/3 goes;
    # EOS stays, as every EOG token does
    assert _keep({0: 0.05, 4: 0.6, 5: 0.22, 6: 0.13}) == {0, 4}


def test_a_prefix_merges_into_the_likelier_token():
    # "ret" (0.15) is a prefix of "return" (0.5): "return" gets 0.65 and "ret" leaves; y 0.19 < 0.2 is cut
    assert _keep({3: 0.5, 2: 0.15, 5: 0.19, 6: 0.16}) == {3}
    # "ret" 0.3 takes "retu" 0.25: without the merge all three would pass both cuts (0.2, then 1/4)
    assert _keep({2: 0.3, 7: 0.25, 6: 0.45}) == {2, 6}


def test_the_second_threshold_is_one_over_text_kept_plus_one():
    assert _keep({4: 0.36, 5: 0.34, 6: 0.30}) == {4, 5, 6}  # three pass 0.2; the cut is 1/4: all stay
    assert _keep({4: 0.50, 5: 0.28, 6: 0.22}) == {4, 5}  # three pass 0.2; z 0.22 < 1/4 goes


def test_every_text_token_under_the_threshold_falls_back_to_eot():
    text = {4: 0.19, 5: 0.19, 6: 0.19, 8: 0.19}
    assert _keep(text | {2: 0.10, 3: 0.12, 0: 0.02}) == {3, 0}  # "ret" + "return" = 0.22 passes alone
    probs = text | {2: 0.09, 3: 0.09, 0: 0.02}  # merged 0.18: every text token is under 0.2 (3 × 0.02 × 7 < 0.96)
    assert _keep(probs) is None
    w = warp(np.log(np.array([[probs.get(i, 1e-9) for i in range(9)]], dtype=np.float32)),
             SamplingParams(temperature=1.0, infill=TOY))
    assert w.dense(9)[0].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0]  # EOT alone, probability 1


def test_the_warp_samples_the_softmax_of_the_surviving_logits():
    """llama.cpp's dist recomputes p from the logits: the merged mass decides who stays, not how likely."""
    probs = np.array([1e-9, 1e-9, 0.10, 0.35, 1e-9, 0.33, 0.22, 1e-9, 1e-9])
    logits = np.log(probs).astype(np.float32)[None]
    got = warp(logits, SamplingParams(temperature=1.0, infill=TOY)).dense(9)[0]
    # "return" 0.45 after the merge, y 0.33, z 0.22 < 1/4: return and y stay (and the EOG tokens, at ~1e-9)
    assert set(np.flatnonzero(got > 1e-6)) == {3, 5}
    assert abs(got[3] - 0.35 / 0.68) < 1e-6 and abs(got[5] - 0.33 / 0.68) < 1e-6


def test_greedy_takes_the_argmax_of_what_infill_keeps():
    probs = np.array([0.2, 1e-9, 1e-9, 1e-9, 0.3, 0.25, 0.25, 1e-9, 1e-9])  # EOG wins: 3 × 0.2 × 9 > 0.8
    logits = np.log(probs).astype(np.float32)[None]
    params = SamplingParams(temperature=0.0, infill=TOY)
    assert greedy(logits, params).tolist() == [0]  # the argmax of the kept set (EOS), not the row's (x)
    assert greedy(logits, replace(params, infill=replace(TOY, tempered=True))).tolist() == [4]
    assert greedy(logits, replace(params, top_k=1)).tolist() == [4]  # top-k 1 leaves x alone


# -- against llama.cpp ------------------------------------------------------------------------------------------

def llama_infill_probs(model, logits: np.ndarray, top_k: int, top_p: float, temp: float | None = None) -> np.ndarray:
    """[V] probabilities llama.cpp's chain top_k, top_p, infill[, temperature], dist gives one row."""
    V = logits.shape[0]
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    steps = [llama_cpp.llama_sampler_init_top_k(top_k), llama_cpp.llama_sampler_init_top_p(top_p, 0),
             llama_cpp.llama_sampler_init_infill(model._model.vocab)]
    if temp is not None:
        steps.append(llama_cpp.llama_sampler_init_temp(temp))
    for s in [*steps, llama_cpp.llama_sampler_init_dist(1234)]:
        llama_cpp.llama_sampler_chain_add(chain, s)
    try:
        data = (llama_cpp.llama_token_data * V)()
        for i, x in enumerate(logits.astype(np.float32).tolist()):
            data[i].id, data[i].logit, data[i].p = i, x, 0.0
        arr = llama_cpp.llama_token_data_array(data, V, -1, False)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
        out = np.zeros(V)
        for i in range(arr.size):
            out[arr.data[i].id] += arr.data[i].p
        return out
    finally:
        llama_cpp.llama_sampler_free(chain)


def _rows(model, rng: np.random.Generator) -> list[np.ndarray]:
    """Rows that reach each branch on the real vocabulary: flat and peaked text, EOG-heavy, and leaders whose
    pieces are prefixes of each other (" re", " ret", " return")."""
    V = model.n_vocab
    prefixes = [model.tokenize(s, add_special=False)[0] for s in (" re", " ret", " return", " r")]
    rows = []
    for scale, eog_boost, pref_boost in [(1.0, 0, 0), (3.0, 0, 0), (2.0, 9, 0), (2.0, 6, 0), (2.0, 0, 8),
                                         (1.5, 0, 6), (4.0, 0, 0), (0.8, 3, 4)]:
        x = (rng.gumbel(size=V) * scale).astype(np.float32)
        x[model.eos] += eog_boost
        x[prefixes] += pref_boost + rng.normal(size=len(prefixes)).astype(np.float32)
        rows.append(x)
    return rows


@pytest.mark.parametrize("top_k,top_p,temp", [(40, 0.90, None), (40, 0.99, None), (20, 0.95, 0.7), (100, 1.0, None)])
def test_warp_matches_llamacpp_infill_chain(smollm2_target, top_k, top_p, temp):
    m = smollm2_target
    infill = Infill(piece=m.piece, is_eog=m.is_eog, eot=m.eot)
    params = SamplingParams(temperature=1.0 if temp is None else temp, top_k=top_k, top_p=top_p, infill=infill)
    for row in _rows(m, np.random.default_rng(top_k)):
        want = llama_infill_probs(m, row, top_k, top_p, temp)
        got = warp(row[None], params).dense(m.n_vocab)[0]
        assert np.array_equal(np.flatnonzero(got), np.flatnonzero(want)), "different surviving tokens"
        assert np.abs(got - want).max() < 2e-5
