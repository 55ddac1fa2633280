"""DFlash drafter files (backend/dflash.py, speculative/dflash.py) on the tiny qwen35 target (tests/tiny_gguf.py)
with a tiny dflash file written for it (tests/tiny_dflash.py). Drafting with one changes no token: greedy text is
plain decoding's, a seed gives one text, a request after another gives a fresh start's; the drafter's cache follows
the accepted context exactly (its block after a generation is a fresh drafter's on the same context). The random
drafter's drafts are nearly all rejected; the llama.cpp comparison is test_dflash_llamacpp.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CACHE
from test_eagle3 import PROMPT, _run, _same_or_near_tie, load, qwen35_file
from tiny_dflash import BLOCK_SIZE, LAYERS, file_name, write_dflash

from localspec.backend.dflash import DFlashHead, is_dflash
from localspec.sampling.params import SamplingParams
from localspec.speculative.dflash import DFLASH, DFlashDrafter

NEAR = 1e-3  # batched decodes of different shapes differ by ~1e-4 in these logits; a wrong cache by ~0.1


def dflash_file(smollm2_path: Path) -> Path:
    out = CACHE / "fixtures" / file_name()
    return out if out.exists() else write_dflash(smollm2_path, out)


@pytest.fixture(scope="module")
def pair(smollm2_path: Path):
    """(target path, drafter path, target, reference without a drafter)."""
    tp, dp = qwen35_file(smollm2_path, False), dflash_file(smollm2_path)
    t, r = load(tp), load(tp)
    yield tp, dp, t, r
    t.close()
    r.close()


@pytest.fixture
def drafter(pair):
    d = DFlashDrafter(DFlashHead(pair[2], pair[1]))
    yield d
    d.close()


def test_the_file_is_recognised_with_its_layers_and_block(pair, drafter: DFlashDrafter):
    tp, dp, _, _ = pair
    assert is_dflash(dp) and not is_dflash(tp)
    head: DFlashHead = drafter.block_head  # type: ignore[assignment]
    assert head.layers == LAYERS and head.max_draft == BLOCK_SIZE - 1 and not head.causal
    assert drafter.max_k == BLOCK_SIZE - 1


def test_a_file_that_is_no_dflash_drafter_is_refused(pair):
    tp, _, _, reference = pair
    with pytest.raises(ValueError):
        DFlashHead(reference, tp)
    assert reference.on_decode is None


@pytest.mark.parametrize("k", [1, 3, 9])
def test_greedy_is_plain_decoding(pair, drafter: DFlashDrafter, k: int):
    _, _, target, reference = pair
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt)
    spec, steps = _run(target, prompt, drafter, k=k)
    assert {s.source for s in steps if s.drafted} == {DFLASH}
    assert max(s.drafted for s in steps) == min(k, BLOCK_SIZE - 1)  # 9 is cut to the block
    _same_or_near_tie(reference, prompt, plain, spec)


def test_sampled_same_seed_same_text(pair, drafter: DFlashDrafter):
    _, _, target, reference = pair
    params = SamplingParams(temperature=0.9, seed=11)
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt, params=params)
    spec, steps = _run(target, prompt, drafter, k=3, params=params)
    assert sum(s.drafted for s in steps) > 0
    assert spec == plain


def test_the_cache_follows_the_accepted_context(pair, drafter: DFlashDrafter):
    """After rounds of drafts and rollbacks the block is a fresh drafter's on a fresh target that decoded only
    the final context: nothing of a rejected draft or an old block stays in the drafter's cache."""
    tp, dp, target, _ = pair
    prompt = target.tokenize(PROMPT, add_special=True)
    out, _ = _run(target, prompt, drafter, k=4, n=30)
    context = prompt + out
    head: DFlashHead = drafter.block_head  # type: ignore[assignment]
    target.restore(len(context) - 1)
    got = np.array(head.block(context, 4), dtype=np.float64)
    head.finish()
    fresh_target = load(tp)
    fresh = DFlashHead(fresh_target, dp)
    try:
        fresh_target.decode(context[:-1], 0)
        want = np.array(fresh.block(context, 4), dtype=np.float64)
        fresh.finish()
    finally:
        fresh.close()
        fresh_target.close()
    assert np.abs(got - want).max() < NEAR


def test_prompt_reuse_is_a_fresh_start(pair, drafter: DFlashDrafter):
    _, _, target, reference = pair
    a = target.tokenize(PROMPT, add_special=True)
    answer, _ = _run(target, a, drafter, k=3, n=12)
    follow_up = a + answer + target.tokenize(" Then what?", add_special=False)
    again, steps = _run(target, follow_up, drafter, k=3, n=20, fresh=False)
    assert steps[0].n_cached > 0
    plain, _ = _run(reference, follow_up, n=20)
    _same_or_near_tie(reference, follow_up, plain, again)


def test_its_cost_is_timed(pair, drafter: DFlashDrafter):
    _, _, target, _ = pair
    prompt = target.tokenize(PROMPT, add_special=True)
    target.rewind(0)
    target.decode(prompt[:-1], 0)
    t = drafter.block_head.time_step(prompt, repeats=2)  # type: ignore[attr-defined]
    assert t is not None and t > 0
