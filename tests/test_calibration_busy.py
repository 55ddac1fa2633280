"""A calibration a busy minute measured does not keep speculation off on a quiet machine: the entry is
provisional and measured again at the next start that is not busy, and while every source is off the controller
still probes a free one, so a verify cheaper than the calibration said turns speculation back on."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from localspec.speculative.types import Step
from localspec.tuning import calibration as cal_mod
from localspec.tuning.calibration import Calibration, cache_path, calibrate, read_cached
from localspec.tuning.controller import PROBE_SHARE, Adaptive
from localspec.tuning.costs import Costs
from localspec.tuning.rate import v_at

QUIET_V = [1.0, 1.6, 2.3, 3.1, 3.9]  # Gemma-3-270M on 2 quiet cores, as the issue found it: v(4) 3.9
BUSY_V = [1.0, 2.4, 3.5, 4.7, 5.8]  # ... and what a start beside a compile cached: v(4) 5.8, others 1.03
T1 = 0.01


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path / "calibration"))
    return tmp_path / "calibration"


def _start(target, k_max: int, others: float) -> Calibration:
    """calibrate() as a new start calls it: on a model as loaded (flash attention not chosen yet; the last call
    chose it on this one)."""
    target.options = replace(target.options, flash_attn=None)
    return calibrate(target, k_max=k_max, budget_s=60.0, cores=2, others=lambda: others)


def _busy_entry(target, k_max: int, cache) -> dict:
    """The cache entry a start beside a compile wrote for `target`: measured here, then given the busy v and
    others that start recorded."""
    measured = _start(target, k_max, 0.0)
    (entry,) = [p for p in cache.glob("*.json") if "calibration" in json.loads(p.read_text())]
    key = json.loads(entry.read_text())["key"]
    assert cache_path(key) == entry and read_cached(key) is not None
    busy = replace(measured, costs=replace(measured.costs, v=tuple(BUSY_V[:k_max + 1])), others=1.03)
    entry.write_text(json.dumps({"key": key, "calibration": busy.to_dict()}))
    return key


def test_an_entry_measured_busy_is_measured_again_at_a_start_that_is_not_busy(smollm2_target, cache, monkeypatch):
    """others 1.03 cores is busy; a later start with 0.3 cores used by others is not quiet by the thread
    controller's measure (0.2) but not busy either: it measures the entry again (it used to keep it)."""
    target = smollm2_target
    key = _busy_entry(target, 4, cache)
    assert read_cached(key).provisional and read_cached(key).v == tuple(BUSY_V)
    kept = _start(target, 4, 1.2)  # still busy: kept
    assert kept.cached and kept.v == tuple(BUSY_V)
    again = _start(target, 4, 0.3)
    assert not again.cached and again.others == 0.3 and not again.provisional
    assert again.v != tuple(BUSY_V) and read_cached(key).v == again.v  # timed again, and cached
    monkeypatch.setattr(cal_mod, "measure_calibration", lambda *a, **k: pytest.fail("measured a third time"))
    assert _start(target, 4, 0.0).cached


def test_a_writer_killed_mid_write_leaves_nothing_the_next_start_keeps(smollm2_target, cache):
    _start(smollm2_target, 1, 0.0)
    stale = cache / "entry.json.999999999.tmp"  # no such process
    stale.write_text('{"key": ')
    for entry in cache.glob("*.json"):
        entry.unlink()  # the next start misses the cache: it measures and tidies
    _start(smollm2_target, 1, 0.0)
    assert not stale.exists() and list(cache.glob("*.tmp")) == []


def _rounds(ctl: Adaptive, n: int, true_v: list[float]) -> list[int]:
    """n rounds of a copy task (every draft accepted) whose verify costs true_v; the γ of each round."""
    ks = []
    for _ in range(n):
        k = ctl.choose_k()
        ks.append(k)
        if k:
            ctl.observe(Step(tuple(range(k + 1)), k, k, 0.0, v_at(true_v, k) * T1, "lookup"))
        else:
            ctl.observe(Step((1,), 0, 0, 0.0, T1))
    return ks


def test_with_speculation_off_the_controller_still_probes_and_finds_a_cheaper_verify():
    """`-k 4 --lookup` with the busy v(4) 5.8: five tokens a round for 5.8 steps never pays, even with every draft
    accepted, so lookup is off from the start and no verify round would ever correct v. It is probed anyway
    (rarely), each probe finds the verify cheaper, and speculation comes back on."""
    ctl = Adaptive(sources=("lookup",), k_min=4, k_max=4, v=BUSY_V, t1=T1, c={"lookup": 0.0})
    assert ctl.choose_k() == 0 and "slower here" in ctl.spec_disabled_reason
    ks = _rounds(ctl, 3000, QUIET_V)
    assert ctl.spec_disabled_reason is None and ks[-100:] == [4] * 100  # on, and drafting every round
    on_at = next(i for i in range(len(ks)) if all(ks[i:i + 50]))
    probes = [i for i, k in enumerate(ks[:on_at]) if k]
    assert 1 <= len(probes) <= 8  # each probe finds the verify cheaper: a few turn it back on
    assert probes[0] >= (v_at(BUSY_V, 4) - 1) / PROBE_SHARE - 2  # rare: within the share probes may take
    assert all(b - a >= ctl.probe_max for a, b in zip(probes, probes[1:]))


def test_a_hopeless_source_on_a_truly_slow_verify_costs_at_most_the_probe_share():
    ctl = Adaptive(sources=("lookup",), k_min=4, k_max=4, v=BUSY_V, t1=T1, c={"lookup": 0.0})
    ks = _rounds(ctl, 4000, BUSY_V)  # the machine really is that slow: the probes find the same cost
    wasted = sum(v_at(BUSY_V, k) - 1 for k in ks if k)
    assert ctl.spec_disabled_reason and 0 < wasted / (len(ks) + wasted) <= PROBE_SHARE * 1.1


def test_a_hopeless_model_drafter_is_still_not_probed():
    """A drafter that costs a target step a token (the model as its own drafter) stays unprobed: its probe
    would cost a catch-up prefill, and its cost, not v, is what keeps it off."""
    ctl = Adaptive(sources=("model",), k_min=4, k_max=4, v=BUSY_V, t1=T1, c={"model": 1.0})
    assert all(ctl.choose_k() == 0 for _ in range(2000))


@pytest.mark.slow
def test_a_quiet_start_after_a_busy_one_drafts(smollm2_path, cache, monkeypatch):
    """The whole path: the entry a busy start cached, then a quiet start with prompt lookup on a copy task.
    With the busy entry kept (a busy start), nothing is drafted; the quiet start measures again and drafts."""
    from localspec.backend.machine import CpuMeter
    from localspec.bench.samples import REWRITE, REWRITE_START
    from localspec.engine.loader import EngineConfig, load_engine

    config = EngineConfig(model=str(smollm2_path), draft="lookup")

    def drafted(others: float) -> tuple[int, Calibration]:
        monkeypatch.setattr(CpuMeter, "others", lambda self: others)
        engine = load_engine(config, log=lambda *a: None)
        try:
            tokens = engine.tokenize(engine.chat_prompt([{"role": "user", "content": REWRITE}]) + REWRITE_START)
            last = None
            for last in engine.generate(tokens, max_tokens=200):
                pass
            cal = engine.controller.calibration
            assert last is not None and isinstance(cal, Calibration)
            return last.stats.draft_n, cal
        finally:
            engine.close()

    n, cal = drafted(0.0)  # the first start: writes the entry, which is then made a busy one
    (key,) = [p for p in cache.glob("*.json") if "calibration" in json.loads(p.read_text())]
    d = json.loads(key.read_text())
    d["calibration"]["others"] = 1.03
    d["calibration"]["costs"]["v"] = {g: 1.0 + 1.6 * int(g) for g in d["calibration"]["costs"]["v"]}
    key.write_text(json.dumps(d))  # v(γ) 1 + 1.6γ: γ + 1 tokens a round never pay for it, at any γ
    n_busy, cal_busy = drafted(1.2)
    assert cal_busy.v[4] == pytest.approx(7.4) and cal_busy.provisional and n_busy == 0  # kept: still busy
    # the quiet start times v(γ) again: really (the step above), but what it finds here depends on what the other
    # programs on a shared test machine do meanwhile, so it finds a quiet machine's curve
    timed = []
    real = cal_mod.measure
    monkeypatch.setattr(cal_mod, "measure", lambda *a, **k: timed.append(1) or replace(
        real(*a, **k), v=tuple(1.0 + 0.45 * g for g in range(len(d["calibration"]["costs"]["v"]) + 1))))
    n_quiet, cal_quiet = drafted(0.0)
    assert timed and not cal_quiet.cached and not cal_quiet.provisional and cal_quiet.v[4] < 7.4
    assert n_quiet > 0, (n, cal.v, cal_quiet.v)


def test_costs_round_trip_keeps_others():
    cal = Calibration(Costs(v=(1.0, 2.0), t1=T1, c={}), others=1.03)
    assert Calibration.from_dict(cal.to_dict()).provisional
    assert not Calibration(None, others=0.4).provisional and not Calibration(None).provisional
