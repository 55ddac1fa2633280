"""A fast path is used for a model only after its logits matched the reference path's (backend/fastpath.py,
fastpath_trial.py): a stand-in mismatch (the test hook's `skew`, tests/faults/probe.py) turns it off for that
model with one line, the verdict is kept per model layout, and the RWKV-6 file whose 3-D F16 weight llama.cpp's
AMX kernels get wrong loses AMX where the CPU has it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from faults import probe
from faults.probe import FAULT_ENV

from localspec.backend import LoadOptions, Model, fastpath
from localspec.backend.fastpath_trial import distance, spread

pytestmark = pytest.mark.slow


def _has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    """An empty verdict cache, and no fault unless a test sets one (the trials, children, get this process's
    path, which holds the fault hook's folder)."""
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path))
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.syspath_prepend(str(probe.HERE))
    return tmp_path


def test_distance_is_the_total_variation_of_next_token_distributions():
    ref = [np.array([[3.0, 1.0, 0.0, -1.0, -3.0]])]
    assert distance(ref, [ref[0].copy()]) == 0.0 and distance(ref, [2 * ref[0] + 5]) < 1e-12  # scale-free
    assert distance(ref, [np.roll(ref[0], 1, axis=1)]) > fastpath.TOLERANCE  # each logit one token along
    assert distance(ref, [ref[0] + [0.0, 0.0, 0.0, 0.0, 0.1]]) < 0.01 < fastpath.TOLERANCE  # the tail moved
    assert not distance(ref, [np.full((1, 5), np.nan)]) <= fastpath.TOLERANCE  # NaN logits never pass
    assert spread(ref, [ref[0].copy()]) == 0.0 and spread(ref, [ref[0] + 1.0]) > fastpath.REPEAT_TOLERANCE


def test_a_mismatch_turns_the_fast_path_off_for_that_model(verdicts, tiny_mamba_path, monkeypatch):
    """Each logit one token along in mode all: the model loads without extra buffer types, the one line names
    the difference, and the next load reads the verdict. (A tiny model: its F32 weights go to no extra buffer
    type, so mode all runs for real on every CPU, AMX or not.)"""
    monkeypatch.setenv(FAULT_ENV, "all:skew")
    plan = fastpath.choose(tiny_mamba_path)
    assert plan.mode == "none" and plan.source == "probe"  # nothing CPU_REPACK takes: no mode repack to try
    ((mode, how),) = plan.failures
    assert mode == "all" and "from the reference" in how and f"tolerance {fastpath.TOLERANCE}" in how
    notice = plan.notice()
    assert notice is not None and "\n" not in notice and "without extra buffer types" in notice
    m = Model.load(tiny_mamba_path, LoadOptions(n_ctx=64))
    try:
        assert (m.fast_path.mode, m.fast_path.source) == ("none", "cache") and m.fast_path.failures == plan.failures
    finally:
        m.close()


def test_logits_that_change_from_run_to_run_turn_the_fast_path_off(verdicts, tiny_mamba_path, monkeypatch):
    """Noise drawn afresh at each decode, too small to move the distribution past the tolerance: the second run
    of the same decode gives other logits, and that alone turns mode all off."""
    monkeypatch.setenv(FAULT_ENV, "all:jitter")
    plan = fastpath.choose(tiny_mamba_path)
    assert plan.mode == "none"
    ((mode, how),) = plan.failures
    assert mode == "all" and "the same decode gave other logits" in how


def test_the_verdict_is_per_model_layout(verdicts, tiny_lfm2_path, tiny_granitehybrid_path, tmp_path, monkeypatch):
    """The two tiny hybrids have the same weight types (F32, F16 embeddings) and other tensors: a mismatch on
    one says nothing of the other, which is tried on its own. A copy of a file is the same model: it shares the
    verdict."""
    monkeypatch.setenv(FAULT_ENV, "all:skew")
    assert fastpath.choose(tiny_lfm2_path).mode == "none"
    monkeypatch.delenv(FAULT_ENV)
    other = fastpath.choose(tiny_granitehybrid_path)
    assert (other.source, other.failures) == ("probe", ())
    copy = shutil.copy(tiny_lfm2_path, tmp_path / "copy.gguf")
    again = fastpath.choose(Path(copy))
    assert (again.mode, again.source) == ("none", "cache")


def test_the_rwkv6_fixture_runs_and_passes_its_trial_without_amx(verdicts, tiny_rwkv6_path):
    """Where the CPU has no AMX, no extra buffer type takes its F16 weight: the trial passes with the same logits
    as the reference, and two decodes of one prompt agree."""
    if _has_amx():
        pytest.skip("this CPU has AMX: test_amx_is_switched_off_for_the_rwkv6_fixture covers it")
    plan = fastpath.choose(tiny_rwkv6_path)
    assert plan.mode == "all" and plan.failures == () and plan.distance is not None
    assert plan.distance <= fastpath.TOLERANCE
    m = Model.load(tiny_rwkv6_path, LoadOptions(n_ctx=128))
    try:
        prompt = m.tokenize("The quick brown fox", add_special=True)
        first = np.array(m.decode(prompt, 1))
        m.rewind(0)
        assert np.array_equal(first, m.decode(prompt, 1)) and np.isfinite(first).all()
    finally:
        m.close()


@pytest.mark.skipif(not _has_amx(), reason="needs a CPU with AMX (amx_tile in /proc/cpuinfo)")
def test_amx_is_switched_off_for_the_rwkv6_fixture(verdicts, tiny_rwkv6_path):
    """llama.cpp's AMX kernels take the 3-D F16 time_mix_w2 and crash or compute other logits: the trial finds
    it, and the model loads without AMX, giving the reference path's logits every time."""
    plan = fastpath.choose(tiny_rwkv6_path)
    assert plan.mode != "all" and plan.failures and plan.failures[0][0] == "all"
    assert plan.notice() is not None and "AMX" in plan.notice()
    m = Model.load(tiny_rwkv6_path, LoadOptions(n_ctx=128))
    ref = Model.load(tiny_rwkv6_path, LoadOptions(n_ctx=128, fast_path="none"))
    try:
        prompt = m.tokenize("The quick brown fox", add_special=True)
        got, want = np.array(m.decode(prompt, 1)), np.array(ref.decode(prompt, 1))
        assert distance([want], [got]) <= fastpath.TOLERANCE
    finally:
        m.close()
        ref.close()
