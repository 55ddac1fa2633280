"""EAGLE-3 drafter files (backend/eagle3.py, speculative/eagle3.py) on the tiny qwen35 targets (tests/tiny_gguf.py)
with tiny eagle3 files written for them (tests/tiny_eagle3.py). Drafting with one changes no token: greedy text is
plain decoding's, a seed gives one text, a request after another gives a fresh start's; the drafter's cache follows
the accepted context exactly (its logits after a generation are a fresh drafter's on the same context).

The random drafter's drafts are all rejected; the echo drafter (for the echo target, a bigram trunk) names the
token the target will choose next, so its first drafts are mostly accepted and the accepted path runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CACHE
from drafting import NEAR_TIE
from drafting import run_fixed as _run
from drafting import same_or_near_tie as _same_or_near_tie
from tiny_eagle3 import file_name, write_eagle3, write_eagle3_echo
from tiny_gguf import VERSION, write_qwen35_echo, write_tiny
from tiny_gguf import file_name as tiny_name

from localspec.backend import LoadOptions, Model
from localspec.backend.eagle3 import Eagle3Head, is_eagle3
from localspec.sampling.params import SamplingParams
from localspec.speculative.eagle3 import EAGLE3, Eagle3Drafter

OPTIONS = LoadOptions(n_ctx=512)
PROMPT = "Write a short story about a robot who learns to paint."


def qwen35_file(smollm2_path: Path, echo: bool) -> Path:
    """The tiny qwen35 target, random or the echo one (noise 1.0 in its MTP head, which no test here loads)."""
    if not echo:
        out = CACHE / "fixtures" / tiny_name("qwen35")
        return out if out.exists() else write_tiny("qwen35", smollm2_path, out)
    out = CACHE / "fixtures" / f"tiny-qwen35-echo-v{VERSION}-1.0.gguf"
    return out if out.exists() else write_qwen35_echo(smollm2_path, out, noise=1.0)


def eagle3_file(smollm2_path: Path, echo: bool) -> Path:
    """The tiny eagle3 drafter for that target."""
    out = CACHE / "fixtures" / file_name(0.0 if echo else None)
    if out.exists():
        return out
    if echo:
        return write_eagle3_echo(qwen35_file(smollm2_path, True), smollm2_path, out)
    return write_eagle3(smollm2_path, out)


def load(path: Path) -> Model:
    """One thread: these models are tiny, and on a busy 2-core machine a second thread only waits for a core."""
    m = Model.load(path, OPTIONS)
    m.set_threads(1, 1)
    return m


@pytest.fixture(scope="module", params=[False, True], ids=["random", "echo"])
def pair(request: pytest.FixtureRequest, smollm2_path: Path):
    """(echo, target path, drafter path, target, reference without a drafter)."""
    tp, dp = qwen35_file(smollm2_path, request.param), eagle3_file(smollm2_path, request.param)
    t, r = load(tp), load(tp)
    yield request.param, tp, dp, t, r
    t.close()
    r.close()


@pytest.fixture
def drafter(pair):
    d = Eagle3Drafter(Eagle3Head(pair[3], pair[2]))
    yield d
    d.close()


def test_the_file_is_recognised_and_reads_three_target_layers(pair, drafter: Eagle3Drafter):
    _, tp, dp, _, _ = pair
    assert is_eagle3(dp) and not is_eagle3(tp)
    assert drafter.head.layers == [1, 2, 3]  # type: ignore[attr-defined]


def test_a_file_that_is_no_eagle3_drafter_is_refused(pair):
    _, tp, _, _, reference = pair
    with pytest.raises(ValueError, match="three"):
        Eagle3Head(reference, tp)
    assert reference.on_decode is None


def test_greedy_is_plain_decoding(pair, drafter: Eagle3Drafter):
    echo, _, _, target, reference = pair
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt)
    spec, steps = _run(target, prompt, drafter, k=3)
    drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
    assert drafted > 0 and {s.source for s in steps if s.drafted} == {EAGLE3}
    if echo:  # first drafts name the target's next token (mostly), later ones repeat it
        assert 0 < accepted < drafted
        assert sum(s.accepted > 0 for s in steps if s.drafted) >= sum(1 for s in steps if s.drafted) / 2
    _same_or_near_tie(reference, prompt, plain, spec)


@pytest.mark.parametrize("k", [1, 3])
def test_sampled_same_seed_same_text(pair, drafter: Eagle3Drafter, k: int):
    _, _, _, target, reference = pair
    params = SamplingParams(temperature=0.9, seed=11)
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt, params=params)
    spec, steps = _run(target, prompt, drafter, k=k, params=params)
    assert sum(s.drafted for s in steps) > 0
    assert spec == plain


def test_the_cache_follows_the_accepted_context(pair, drafter: Eagle3Drafter):
    """After rounds of drafts, rejections and rollbacks, the drafter drafts from what a fresh drafter on a fresh
    target that decoded only the final context drafts from: nothing of a rejected draft stays in its cache."""
    _, tp, dp, target, _ = pair
    prompt = target.tokenize(PROMPT, add_special=True)
    out, _ = _run(target, prompt, drafter, k=4, n=30)
    context = prompt + out
    head: Eagle3Head = drafter.head  # type: ignore[assignment]
    target.restore(len(context) - 1)
    got = np.array(head.start(context), dtype=np.float64)
    head.finish()
    fresh_target = load(tp)
    fresh = Eagle3Head(fresh_target, dp)
    try:
        fresh_target.decode(context[:-1], 0)
        want = np.array(fresh.start(context), dtype=np.float64)
        fresh.finish()
    finally:
        fresh.close()
        fresh_target.close()
    assert np.abs(got - want).max() < NEAR_TIE


def test_prompt_reuse_is_a_fresh_start(pair, drafter: Eagle3Drafter):
    """A follow-up request reuses the caches (the target's and the drafter's) and gives a fresh start's text."""
    _, _, _, target, reference = pair
    a = target.tokenize(PROMPT, add_special=True)
    answer, _ = _run(target, a, drafter, k=3, n=12)
    follow_up = a + answer + target.tokenize(" Then what?", add_special=False)
    again, steps = _run(target, follow_up, drafter, k=3, n=20, fresh=False)
    assert steps[0].n_cached > 0
    plain, _ = _run(reference, follow_up, n=20)
    _same_or_near_tie(reference, follow_up, plain, again)


def test_closing_the_drafter_frees_the_target(pair):
    _, _, dp, target, _ = pair
    head = Eagle3Head(target, dp)
    assert target.on_decode is not None
    head.close()
    assert target.on_decode is None
    target.rewind(0)
    target.decode(target.tokenize(PROMPT, add_special=True), 1)  # no rows kept, nothing read: still decodes


def test_a_rebuilt_target_context_keeps_drafting(pair, drafter: Eagle3Drafter):
    """A flash attention switch rebuilds the target's context (the calibration makes one), which may come back at
    the old address without the rows switched on: the drafter tells, and still drafts plain decoding's text."""
    _, _, _, target, reference = pair
    prompt = target.tokenize(PROMPT, add_special=True)
    _run(target, prompt, drafter, k=3, n=8)
    was = target.options.flash_attn
    try:
        for on in (True, False):  # twice, so that one of them is a change whatever llama.cpp chose
            target.set_flash_attn(on)
            target.decode(prompt[:-1], 0)  # the calibration decodes on the new context before any draft
            spec, steps = _run(target, prompt, drafter, k=3, n=20)
            plain, _ = _run(reference, prompt, n=20)
            assert sum(s.drafted for s in steps) > 0
            _same_or_near_tie(reference, prompt, plain, spec)
    finally:
        target.set_flash_attn(was)
