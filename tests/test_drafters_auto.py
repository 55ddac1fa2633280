"""--draft auto and --draft self from the command line, on real files: run says in one line which drafter it chose
and why, the bench resolves auto/self per target and names the file, a drafter too large to pay is warned about
with the numbers, and --models-dir reaches the engine config."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.commands.bench import bench_targets
from localspec.commands.options import engine_options
from localspec.engine.drafter_choice import warn_if_too_large
from localspec.engine.loader import EngineConfig
from localspec.errors import IncompatibleDrafter
from localspec.tuning.predict import rank


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_f16_path: Path) -> Path:
    """SmolLM2 F16 under a new name in a folder of its own; no user config, an empty hub cache, no network."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LOCALSPEC_MODELS_DIR", raising=False)
    t = tmp_path / "target" / "smol-f16.gguf"
    t.parent.mkdir()
    t.symlink_to(smollm2_f16_path)
    return t


def self_copy(target: Path, smollm2_path: Path) -> Path:
    """A stand-in for make-drafter's Q4_0 copy where --draft self looks: the Q4_1 file of the same model (the same
    tensors at fewer bits), linked, so the test quantizes nothing."""
    from localspec.models.candidates import self_drafter_path

    out = self_drafter_path(target)
    out.symlink_to(smollm2_path)
    return out


def test_models_dir_reaches_the_engine_config(tmp_path: Path) -> None:
    seen: list[EngineConfig] = []

    @click.command()
    @engine_options
    def probe(engine_config: EngineConfig) -> None:  # the option block run, chat and serve share
        seen.append(engine_config)

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    res = CliRunner().invoke(probe, ["--draft", "auto", "--models-dir", a, "--models-dir", b])
    assert res.exit_code == 0, res.output
    assert seen[0].draft == "auto" and seen[0].models_dirs == (a, b)


def test_too_large_drafter_is_warned_with_numbers(smollm2_path: Path, smollm2_f16_path: Path) -> None:
    said: list[str] = []
    warn_if_too_large(smollm2_path, smollm2_f16_path, "SmolLM2 F16", log=said.append)  # 2.8x the target's bytes
    assert len(said) == 1 and "warning" in said[0] and "too large to pay" in said[0]
    assert "c 2." in said[0] and "x at best (k=" in said[0] and "from file sizes" in said[0]
    said.clear()
    warn_if_too_large(smollm2_f16_path, smollm2_path, "SmolLM2 Q4_1", log=said.append)  # a third of it: no warning
    assert said == []


def test_bench_resolves_self_and_auto_per_target(target: Path, smollm2_path: Path) -> None:
    with pytest.raises(IncompatibleDrafter, match="make-drafter"):
        bench_targets((str(target),), ("self",), ())
    own = self_copy(target, smollm2_path)
    (spec,) = bench_targets((str(target),), ("self",), (), lookup=True)
    assert spec.drafters == ((own.name, own),) and spec.lookup
    best = next(r for r in rank(target) if r.prediction is not None)
    assert best.match.file.path == own  # the own copy ranks first
    (spec,) = bench_targets((str(target),), ("auto",), ())
    if best.prediction is not None and best.prediction.speedup > 1:  # as run would: it drafts with the copy
        assert spec.drafters == ((own.name, own),) and not spec.lookup
    else:  # predicted to lose here (v(γ) guessed on a CPU): prompt lookup, as run would
        assert spec.drafters == () and spec.lookup


def test_bench_auto_without_candidates_benches_lookup(target: Path, gemma_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (spec,) = bench_targets((str(gemma_path),), ("auto",), ())
    assert spec.drafters == () and spec.lookup
    assert "prompt lookup" in capsys.readouterr().err
    res = CliRunner().invoke(main, ["models", "drafters", str(gemma_path)])  # already 4-bit: no copy offered
    assert res.exit_code == 0 and "self-Q4_0" not in res.output
    assert res.output.strip().endswith("--draft auto drafts by prompt lookup for it"), res.output


@pytest.mark.slow
def test_run_draft_auto_says_which_in_one_line(target: Path, smollm2_path: Path, tmp_path: Path) -> None:
    d = tmp_path / "drafters"
    d.mkdir()
    (d / "renamed.gguf").symlink_to(smollm2_path)
    res = CliRunner().invoke(main, ["run", "-m", str(target), "--draft", "auto", "--models-dir", str(d), "-n", "4",
                                    "--ctx", "256", "--threads", "2", "--no-adaptive", "Hello"])  # no calibration
    assert res.exit_code == 0, res.output
    said = [ln for ln in res.output.splitlines() if "--draft auto" in ln]
    assert len(said) == 1, res.output
    assert ("same tokenizer" in said[0] and "predicted" in said[0]) or "prompt lookup" in said[0]


@pytest.mark.slow
def test_run_with_a_drafter_too_large_prints_the_warning(target: Path, smollm2_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", "-m", str(smollm2_path), "--draft", str(target), "-n", "2", "--ctx", "256",
                                    "--threads", "2", "--no-adaptive", "Hello"])
    assert res.exit_code == 0, res.output
    assert "warning: drafter smol-f16.gguf is too large to pay" in res.output
