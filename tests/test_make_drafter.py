"""A drafter made from its target with llama.cpp's quantizer: written beside the target, found by --draft self
and by --draft auto, ranked first for an F16 target."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.engine.drafter_choice import choose_drafter
from localspec.engine.loader import EngineConfig
from localspec.models.candidates import self_drafter_path
from localspec.tuning.predict import rank


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_f16_path: Path) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = tmp_path / "target" / "smol-f16.gguf"
    t.parent.mkdir()
    t.symlink_to(smollm2_f16_path)
    return t


def test_make_drafter_then_self_and_auto(target: Path, smollm2_path: Path) -> None:
    res = CliRunner().invoke(main, ["models", "make-drafter", str(target)])
    assert res.exit_code == 0, res.output
    out = self_drafter_path(target)
    assert out.parent == target.parent and out.is_file() and out.stat().st_size < target.stat().st_size / 2
    assert "predicted" in res.output and "own copy" in res.output

    said: list[str] = []
    draft, _ = choose_drafter(EngineConfig(draft="self"), "smol", target, log=said.append)
    assert Path(draft) == out and "self copy" in said[0]

    ranked = rank(target, [out.parent])
    usable = [r for r in ranked if r.prediction is not None]
    assert usable[0].match.file.path == out  # the own copy: higher prior, smallest file
    assert any(r.match.file.path.resolve() == smollm2_path.resolve() for r in usable)
    speeds = [r.prediction.speedup for r in usable if r.prediction]
    assert speeds == sorted(speeds, reverse=True)

    said.clear()
    draft, _ = choose_drafter(EngineConfig(draft="auto"), "smol", target, log=said.append)
    assert len(said) == 1 and out.name in said[0] and "same tokenizer" in said[0] or "prompt lookup" in said[0]

    res = CliRunner().invoke(main, ["models", "drafters", str(target)])
    assert res.exit_code == 0, res.output
    assert out.name in res.output and "share" in res.output


def test_self_without_copy_refused(target: Path) -> None:
    from localspec.errors import IncompatibleDrafter

    with pytest.raises(IncompatibleDrafter, match="make-drafter"):
        choose_drafter(EngineConfig(draft="self"), "smol", target)
