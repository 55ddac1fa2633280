"""An EAGLE-3 drafter file in the bench and in the load-time calibration.

`bench --draft FILE` with an eagle3 file runs it beside the target as `run` does (not loaded as a model, which would
abort llama.cpp: an eagle3 model decodes only beside its target's context), in rows labelled with the file's name,
whose greedy text is plain decoding's. The drafter's cost c is timed at load as the MTP head's is (backend/mtp.py's
`measure_cost`), kept in the calibration's cache entry (its key names the drafter file) and read back by the next
start; the controller starts from it.

The fixtures are tests/tiny_eagle3.py's echo drafter for the echo qwen35, as tests/test_eagle3.py writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_eagle3 import eagle3_file, qwen35_file

from localspec.cli import main
from localspec.speculative.eagle3 import EAGLE3
from localspec.tuning.controller import Adaptive


@pytest.mark.slow
def test_bench_runs_the_eagle3_file_beside_the_target(smollm2_path: Path, tmp_path: Path):
    """`bench --draft FILE`: plain and `FILE k=2` rows, the drafter's c among the target's costs under its label,
    drafts made and some accepted, and every greedy run's text the plain run's (agreement records)."""
    target, drafter = qwen35_file(smollm2_path, True), eagle3_file(smollm2_path, True)
    out = tmp_path / "b.json"
    r = CliRunner().invoke(main, ["bench", "--model", str(target), "--draft", str(drafter), "-k", "2", "--tasks",
                                  "prose", "--per-task", "1", "-n", "8", "--ctx", "512", "--threads", "1", "--json",
                                  str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    (t,) = d["targets"]
    labels = {x["drafter"] for x in d["runs"]} - {"none"}
    (label,) = labels
    assert label in (drafter.name, drafter.name.removesuffix(".gguf"))
    assert f"{label} k=2" in r.output and "EAGLE-3 drafter" in r.output
    assert t["costs"]["c"][label] > 0
    assert {x["config"] for x in d["results"]} == {"plain", f"{label} k=2"}
    runs = [x for x in d["runs"] if x["drafter"] == label]
    assert runs and all(x["draft_n"] > 0 for x in runs) and any(x["draft_n_accepted"] > 0 for x in runs)
    agreement = [a for a in d["agreement"] if a["drafter"] == label]
    assert len(agreement) == len(runs) and all(a["agree"] for a in agreement)


@pytest.mark.slow
def test_the_eagle3_cost_is_calibrated_and_cached(smollm2_path: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    """The drafter's c is timed by the load-time calibration with v(γ), kept in the target's cache entry under
    source eagle3 (its key names the drafter file), read back by the next start, and the controller starts from
    it rather than learning it online from nothing."""
    from localspec.engine.loader import EngineConfig, load_engine

    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path))
    target, drafter = qwen35_file(smollm2_path, True), eagle3_file(smollm2_path, True)
    config = EngineConfig(model=str(target), draft=str(drafter), n_ctx=512, threads=1)
    seen = []
    for _ in range(2):
        engine = load_engine(config, log=lambda *a: None)
        try:
            ctl = engine.controller
            cal = ctl.calibration if isinstance(ctl, Adaptive) else None
            assert cal is not None and cal.costs is not None
            seen.append((cal.cached, cal.costs.c[EAGLE3], ctl.state().c[EAGLE3]))
        finally:
            engine.close()
    (cached1, c1, ctl1), (cached2, c2, _) = seen
    assert not cached1 and cached2
    assert c1 > 0 and c2 == c1 and ctl1 == pytest.approx(c1)
    keys = [json.loads(p.read_text()).get("key", {}) for p in tmp_path.glob("*.json")]
    assert any(isinstance(k.get(EAGLE3), dict) and "mtp" not in k for k in keys)


@pytest.mark.slow
def test_the_eagle3_acceptance_is_kept_for_the_pair(smollm2_path: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    """What the drafter file's rounds measured is kept per (target, drafter file), as a model drafter's is, and
    the next start's controller begins from it."""
    from localspec.engine.loader import EngineConfig, load_engine
    from localspec.tuning.acceptance import kept_for

    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path / "cal"))
    monkeypatch.setenv("LOCALSPEC_ACCEPTANCE", str(tmp_path / "acc"))
    target, drafter = qwen35_file(smollm2_path, True), eagle3_file(smollm2_path, True)
    config = EngineConfig(model=str(target), draft=str(drafter), n_ctx=512, threads=1)
    engine = load_engine(config, log=lambda *a: None)
    try:  # the tiny drafter costs about a target step, so it would not draft: a controller told it is cheap does
        engine.controller = Adaptive(sources=(EAGLE3,), c={EAGLE3: 0.1}, learn_costs=False)
        list(engine.generate("Write a short story about a robot who learns to paint.", max_tokens=24))
    finally:
        engine.close()
    kept = kept_for(target, drafter, EAGLE3)
    assert kept is not None and kept.n[0] > 0
    engine = load_engine(config, log=lambda *a: None)
    try:
        ctl = engine.controller
        assert isinstance(ctl, Adaptive) and ctl.src[EAGLE3].n[0] == pytest.approx(kept.n[0], rel=1e-3)
    finally:
        engine.close()


def test_a_target_feeds_one_reader_of_its_hidden_states(smollm2_path: Path):
    """The bench refuses a target with both MTP rows and an EAGLE-3 file (or two files), before any load: each
    would read the target's decodes, and a target reports them to one reader."""
    from localspec.engine.loader import eagle3_drafters
    from localspec.errors import IncompatibleDrafter

    drafter = eagle3_file(smollm2_path, True)
    assert eagle3_drafters("t", [("e", drafter), ("m", smollm2_path)]) == [("e", drafter)]
    with pytest.raises(IncompatibleDrafter, match="one"):
        eagle3_drafters("t", [("e", drafter)], mtp=True)
    with pytest.raises(IncompatibleDrafter):
        eagle3_drafters("t", [("e", drafter), ("f", drafter)])
