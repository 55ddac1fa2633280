"""localspec's warp against llama.cpp's own samplers (through llama-cpp-python) on the same logits.

llama.cpp's default chain is penalties → top-k → top-p → min-p → temperature → dist; `dist` leaves each survivor's
normalised probability in `p`, which is what localspec's warp must reproduce (float32 there, float64 here).
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp
import numpy as np
import pytest

from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import warp


def llama_probs(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = ()) -> np.ndarray:
    """[V] probabilities llama.cpp's default chain gives one row of logits after `history` was accepted."""
    V = logits.shape[0]
    last_n = params.repeat_last_n if params.repeat_last_n >= 0 else len(history)  # llama.cpp has no -1
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for smpl in (
        llama_cpp.llama_sampler_init_penalties(V, last_n, params.repeat_penalty, params.frequency_penalty,
                                               params.presence_penalty),
        llama_cpp.llama_sampler_init_top_k(params.top_k),
        llama_cpp.llama_sampler_init_top_p(params.top_p, 0),
        llama_cpp.llama_sampler_init_min_p(params.min_p, 0),
        llama_cpp.llama_sampler_init_temp(params.temperature),
        llama_cpp.llama_sampler_init_dist(1234),
    ):
        llama_cpp.llama_sampler_chain_add(chain, smpl)  # the chain owns and frees them
    try:
        for t in history:
            llama_cpp.llama_sampler_accept(chain, int(t))
        data = (llama_cpp.llama_token_data * V)()
        for i, x in enumerate(logits.astype(np.float32).tolist()):
            data[i].id, data[i].logit, data[i].p = i, x, 0.0
        arr = llama_cpp.llama_token_data_array(data, V, -1, False)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
        out = np.zeros(V)
        for i in range(arr.size):
            out[arr.data[i].id] = arr.data[i].p
        return out
    finally:
        llama_cpp.llama_sampler_free(chain)


SETTINGS = [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # llama.cpp's and Ollama's defaults
    SamplingParams(temperature=1.3, top_k=200, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=0.8),
    SamplingParams(temperature=1.5, top_p=0.99, min_p=0.01),
    SamplingParams(temperature=0.6, min_p=0.1),
    SamplingParams(temperature=1.0, top_k=100),
    SamplingParams(temperature=2.0),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.3, repeat_last_n=16),
    SamplingParams(temperature=1.0, top_p=0.9, repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.3),
    SamplingParams(temperature=0.9, min_p=0.02, repeat_penalty=0.8, repeat_last_n=-1),
]


def _logits(rng: np.random.Generator, V: int, scale: float) -> np.ndarray:
    """A realistic shape: Gumbel logits (heavy upper tail, a few clear leaders), some of them negative."""
    return (rng.gumbel(size=V) * scale - scale).astype(np.float32)


def _history(rng: np.random.Generator, logits: np.ndarray) -> list[int]:
    """Random tokens plus the row's leaders, repeated: the penalty must move the top of the distribution."""
    lead = np.argsort(-logits)[:12].tolist()
    return rng.integers(0, len(logits), 30).tolist() + lead + lead[:4]


@pytest.mark.parametrize("V", [300, 49_152])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"
                         f"-r{p.repeat_penalty}")
def test_warp_matches_llamacpp(params: SamplingParams, V: int):
    rng = np.random.default_rng(V)
    for scale in (0.7, 2.5):
        logits = _logits(rng, V, scale)
        history = _history(rng, logits)
        want = llama_probs(logits, params, history)
        got = warp(logits, params, history).dense(V)[0]
        assert np.array_equal(got > 0, want > 0), "different surviving tokens"
        assert np.abs(got - want).max() < 2e-5


def test_verify_rows_match_llamacpp_with_the_history_advanced_by_the_drafts():
    """Row i of a verify pass is penalised as llama.cpp would after context + drafts[:i]."""
    rng = np.random.default_rng(7)
    V = 2000
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.5,
                            repeat_last_n=8, frequency_penalty=0.2)
    rows = np.stack([_logits(rng, V, 2.0) for _ in range(4)])
    drafts = np.argsort(-rows[0])[:3].tolist()  # each draft is a leader of the rows after it
    context = rng.integers(0, V, 20).tolist()
    got = warp(rows, params, context, drafts).dense(V)
    for i in range(4):
        assert np.abs(got[i] - llama_probs(rows[i], params, context + drafts[:i])).max() < 2e-5


def test_greedy_with_penalty_is_llamacpp_argmax():
    rng = np.random.default_rng(8)
    V = 1000
    logits = _logits(rng, V, 2.0)
    history = np.argsort(-logits)[:3].tolist()  # the three leaders were just said
    params = SamplingParams(temperature=0.0, repeat_penalty=3.0)
    top = int(warp(logits, params, history).ids[0, 0])
    want = llama_probs(logits, SamplingParams(temperature=0.0, top_k=0, repeat_penalty=3.0), history)
    assert top == int(want.argmax()) and top not in history
