"""Cost measurement (localspec/tuning/costs.py) and load-time calibration (localspec/tuning/calibration.py) on the real
SmolLM2-135M: caches are left as found, thread counts are restored, the budget cuts measurement short, and the
cache makes the second start measure nothing. Behaviour only; speed is measured by `localspec bench --busy N`
(docs/bench/threads.md)."""

from __future__ import annotations

import os

import pytest

from localspec.tuning import calibration as cal_mod
from localspec.tuning.calibration import Calibration, cache_key, calibrate, measure_calibration
from localspec.tuning.costs import Costs, at_least_one, measure, merge, probe_tokens, thread_times

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target(smollm2_target):
    return smollm2_target


@pytest.fixture(scope="module")
def twin(smollm2_twin):
    return smollm2_twin


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path / "calibration"))
    return tmp_path


def test_measure_leaves_caches_as_found_and_reports_v(target, twin):
    target.decode(target.tokenize("Hello there"), 0)
    before = list(target.tokens)
    try:
        c = measure(target, probe_tokens(target, 20), 4, drafters={"model": twin}, lookup=True, repeats=1)
    finally:
        assert target.tokens == before and twin.tokens == []
        target.rewind(0)
    assert len(c.v) == 5 and c.v[0] == 1.0 and min(c.v) == 1.0 and c.timed == (1, 2, 3, 4)
    assert c.t1 > 0 and c.c["model"] > 0 and c.c["lookup"] >= 0 and c.position == len(before) + 20 - 5
    d = c.to_dict()
    assert set(d["v"]) == {"1", "2", "3", "4"} and Costs.from_dict(d).v == pytest.approx(c.v)
    assert Costs.from_dict(d).timed == c.timed


def test_thread_times_cover_every_count_and_restore_the_setting(target):
    target.set_threads(2, 1)
    times = thread_times(target, [1, 2], probe_tokens(target, 1), repeats=1)
    assert set(times) == {1, 2} and all(t > 0 for t in times.values())
    assert target.threads == (2, 1) and target.tokens == []


def test_merge_keeps_the_dips():
    """A batch that fills a kernel tile costs less than one row fewer: v is not smoothed into monotone."""
    a = Costs(0.01, (1.0, 1.5, 2.0, 1.8), {"model": 0.4}, timed=(1, 2, 3))
    b = Costs(0.03, (1.0, 1.3, 1.2, 1.6), {"model": 0.6}, timed=(1, 2, 3))
    m = merge(a, b)
    assert m.t1 == pytest.approx(0.02) and m.c["model"] == pytest.approx(0.5) and m.timed == (1, 2, 3)
    assert m.v == pytest.approx((1.0, 1.4, 1.6, 1.7))
    assert at_least_one([1.0, 0.9, 1.4, 1.3]) == (1.0, 1.0, 1.4, 1.3)


def test_calibration_measures_every_phase_within_a_generous_budget(target, twin):
    cal = measure_calibration(target, k_max=3, draft_model=twin, budget_s=60.0, cores=2)
    assert cal.complete and set(cal.threads) == {"target", "draft", "prompt"}
    assert set(cal.threads["target"]) == {1, 2} and cal.costs.c["model"] > 0 and len(cal.v) == 4
    assert cal.flash_attn in (True, False) and target.options.flash_attn in (cal.flash_attn, None)
    assert target.tokens == [] and twin.tokens == []


def test_budget_cuts_calibration_short_but_keeps_the_thread_prior_and_v(target):
    """No budget at all: the first stage (the target's step per thread count) finishes, and so does v(γ), on
    which every decision of the γ controller rests; the rest is left for the next start."""
    cal = measure_calibration(target, k_max=3, budget_s=0.0, cores=2)
    assert not cal.complete and set(cal.threads["target"]) == {1, 2} and "prompt" not in cal.threads
    assert cal.costs is not None and len(cal.v) == 4 and cal.costs.timed == (1, 2, 3)
    assert target.tokens == []
    plain = measure_calibration(target, k_max=0, budget_s=0.0, cores=2)  # nothing drafts: v is not owed
    assert plain.costs is None and not plain.complete


def test_v_is_timed_as_deep_as_the_prompts_it_pays_on(target, monkeypatch):
    """v(γ) at V_DEPTH tokens of context (the 150-700-token prompts of copy-heavy work), not at the first few;
    a context too small for that is timed as deep as it allows."""
    cal = measure_calibration(target, k_max=3, budget_s=60.0, cores=2)
    assert cal.costs.position == cal_mod.V_DEPTH and target.tokens == []
    monkeypatch.setattr(cal_mod, "V_DEPTH", target.n_ctx)  # deeper than this context holds
    cal = measure_calibration(target, k_max=3, budget_s=60.0, cores=2)
    assert cal.costs.position == target.n_ctx - 3 - 2 and target.tokens == []


def test_a_busy_start_times_no_more_threads_than_the_free_cores(target, cache):
    """Two other programs on 2 cores: only 1 thread is timed (2 would wait on preempted threads for seconds);
    a quiet start later times them all, the entry having been measured busy."""
    busy = calibrate(target, k_max=2, budget_s=60.0, cores=2, others=lambda: 1.5)
    assert busy.complete and set(busy.threads["target"]) == {1} and busy.others == 1.5
    quiet = calibrate(target, k_max=2, budget_s=60.0, cores=2, others=lambda: 0.0)
    assert not quiet.cached and set(quiet.threads["target"]) == {1, 2}


def test_second_start_reads_the_cache(target, cache, monkeypatch):
    first = calibrate(target, k_max=2, budget_s=60.0, cores=2)
    assert not first.cached and first.complete
    assert list((cache / "calibration").glob("*.json"))
    monkeypatch.setattr(cal_mod, "measure_calibration", lambda *a, **k: pytest.fail("measured again"))
    second = calibrate(target, k_max=2, budget_s=60.0, cores=2)
    assert second.cached and second.v == pytest.approx(first.v) and second.threads == first.threads


def test_partial_cache_entry_is_completed_at_the_next_start(target, cache, monkeypatch):
    """A budget too short for everything still completes over starts: each measures only what is missing."""
    partial = calibrate(target, k_max=2, budget_s=0.0, cores=2)
    assert not partial.complete and "target" in partial.threads
    seen = []
    real = cal_mod.thread_times
    monkeypatch.setattr(cal_mod, "thread_times", lambda m, c, t, **k: seen.append(len(t)) or real(m, c, t, **k))
    again = calibrate(target, k_max=2, budget_s=60.0, cores=2)
    assert not again.cached and again.complete and again.costs is not None
    assert again.threads["target"] == partial.threads["target"]  # kept, not measured again
    assert seen == [cal_mod.PROMPT_CHUNK]  # only the prompt phase was timed per count this time
    assert calibrate(target, k_max=2, budget_s=60.0, cores=2).cached


def test_cache_key_follows_the_file_and_the_machine(target, tmp_path):
    key = cache_key(target, None, 4, 2)
    assert key["target"]["size"] == os.path.getsize(target.path) and "llama-cpp-python" in key["build"]
    assert cache_key(target, None, 4, 3) != key and cache_key(target, None, 8, 2) != key
    assert Calibration.from_dict(Calibration(None, {"target": {1: 0.1}}).to_dict()).threads == {"target": {1: 0.1}}


def test_a_hard_deadline_drops_the_measurement_and_restores_settings(target):
    from localspec.tuning.costs import Deadline, OutOfTime, flash_attn_times

    past = Deadline(0.0, hard=True)
    with pytest.raises(OutOfTime):
        thread_times(target, [1, 2], probe_tokens(target, 1), deadline=past)
    found = target.options.flash_attn
    with pytest.raises(OutOfTime):
        flash_attn_times(target, probe_tokens(target, 4), deadline=past)
    assert target.options.flash_attn == found and target.tokens == []
    assert set(thread_times(target, [1, 2], probe_tokens(target, 1), deadline=Deadline(0.0))) == {1, 2}  # soft


def test_thread_times_measured_on_a_busy_machine_are_measured_again_on_a_quiet_one(target, cache, monkeypatch):
    """An entry cached while a build ran (two cores busy) says "1 thread" and would keep an idle machine at half
    speed, and its v(γ) was timed at 1 thread: a quiet start times both again; a busier start keeps a quiet
    entry."""
    busy = calibrate(target, k_max=2, budget_s=60.0, cores=2, others=lambda: 2.0)
    assert busy.others == 2.0 and Calibration.from_dict(busy.to_dict()).others == 2.0
    seen, timed_v = [], []
    real, real_measure = cal_mod.thread_times, cal_mod.measure
    monkeypatch.setattr(cal_mod, "thread_times", lambda m, c, t, **k: seen.append(len(t)) or real(m, c, t, **k))
    monkeypatch.setattr(cal_mod, "measure", lambda *a, **k: timed_v.append(1) or real_measure(*a, **k))
    quiet = calibrate(target, k_max=2, budget_s=60.0, cores=2, others=lambda: 0.0)
    assert not quiet.cached and quiet.complete and quiet.others == 0.0 and len(seen) == 2  # target and prompt
    assert timed_v == [1] and quiet.costs is not None
    monkeypatch.setattr(cal_mod, "measure_calibration", lambda *a, **k: pytest.fail("measured again"))
    assert calibrate(target, k_max=2, budget_s=60.0, cores=2, others=lambda: 2.0).cached


def test_flash_attention_the_user_chose_is_neither_measured_nor_changed(target, cache, monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(cal_mod, "flash_attn_times", lambda *a, **k: pytest.fail("measured flash attention"))
    found = target.options.flash_attn
    target.options = replace(target.options, flash_attn=False)  # as `--flash-attn off` loads it
    try:
        cal = calibrate(target, k_max=2, budget_s=60.0, cores=2)
        assert cal.complete and cal.flash_attn is None and target.options.flash_attn is False
        assert calibrate(target, k_max=2, budget_s=60.0, cores=2).cached
    finally:
        target.options = replace(target.options, flash_attn=found)


def test_v_is_timed_at_long_drafts_and_interpolated_between():
    """Long lookup drafts need v measured where they are, not extrapolated from γ ≤ 8 (Gemma-3-270M: v(32) 9.9
    measured, 15.7 extrapolated): every γ to 8, then where γ + 1 rows fill kernel tiles of 4, and k_max."""
    from localspec.tuning.costs import interpolate, timed_gammas

    assert timed_gammas(8) == list(range(9)) and timed_gammas(3) == [0, 1, 2, 3]
    assert timed_gammas(32) == [*range(9), 11, 15, 19, 23, 27, 31, 32]
    assert timed_gammas(13) == [*range(9), 11, 13]
    assert timed_gammas(63) == [*range(9), 11, 15, 19, 23, 27, 31, 47, 63]  # past 32 rows: tiles of 16
    v = interpolate({0: 1.0, 8: 5.0, 16: 7.0}, 16)
    assert len(v) == 17 and v[8] == 5.0 and v[12] == pytest.approx(6.0)


def test_measure_times_long_drafts_on_the_real_model(target):
    """Every γ up to 20 gets a cost: the timed ones measured (a finite time, at least one row's), the others
    interpolated between their timed neighbours. No timing is compared with another: with one repeat on a busy
    machine a descheduled round can make any γ look dearer than a longer one."""
    c = measure(target, probe_tokens(target, 40), 20, repeats=1)
    assert len(c.v) == 21 and c.timed == (*range(1, 9), 11, 15, 19, 20)
    assert 0 < c.t1 < float("inf") and c.v[0] == 1.0 and all(1.0 <= x < float("inf") for x in c.v)
    for lo, hi in zip(c.timed, c.timed[1:]):
        for g in range(lo + 1, hi):
            assert min(c.v[lo], c.v[hi]) - 1e-9 <= c.v[g] <= max(c.v[lo], c.v[hi]) + 1e-9
    assert target.tokens == []


def test_v_past_the_measured_points_follows_the_upper_half():
    """Extrapolation uses the slope of the far end (batch kernels get cheaper per row as batches grow)."""
    from localspec.tuning.rate import ROW_GUESS, v_at

    v = [1.0, 2.0, 2.5, 3.0, 3.2, 3.4]  # upper half from index 3: slope 0.2
    assert v_at(v, 5) == 3.4 and v_at(v, 7) == pytest.approx(3.8)
    assert v_at([], 4) == pytest.approx(1 + 4 * ROW_GUESS) and v_at([1.0, 1.5], 3) == pytest.approx(2.5)
