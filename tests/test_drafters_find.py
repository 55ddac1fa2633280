"""Finding a drafter by tokenizer content: renamed files still match, other vocabularies are refused with the
reason, the ranking puts the fastest predicted first, and --draft auto says what it chose."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from localspec.engine.drafter_choice import choose_drafter
from localspec.engine.loader import EngineConfig
from localspec.models import LOOKUP
from localspec.models.candidates import matches, mismatch, tokenizer_print


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user config, an empty hub cache, no network."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LOCALSPEC_MODELS_DIR", raising=False)
    return tmp_path


def test_renamed_copy_matches_by_content(isolated: Path, smollm2_path: Path, smollm2_f16_path: Path) -> None:
    renamed = isolated / "mystery-model.gguf"
    shutil.copyfile(smollm2_path, renamed)
    assert tokenizer_print(renamed).digest == tokenizer_print(smollm2_f16_path).digest
    assert mismatch(smollm2_f16_path, renamed) == []


def test_other_vocabulary_refused_with_reason(isolated: Path, smollm2_f16_path: Path, gemma_path: Path) -> None:
    why = mismatch(smollm2_f16_path, gemma_path)
    assert len(why) == 1 and "different vocabulary" in why[0] and "49152" in why[0] and "262144" in why[0]


def test_search_finds_models_dir_and_skips_target(isolated: Path, smollm2_path: Path, smollm2_f16_path: Path,
                                                  gemma_path: Path) -> None:
    d = isolated / "models"
    d.mkdir()
    (d / "renamed.gguf").symlink_to(smollm2_path)
    (d / "other.gguf").symlink_to(gemma_path)
    found = {m.file.path.resolve(): m for m in matches(smollm2_f16_path, [d])}
    assert smollm2_f16_path.resolve() not in found
    assert found[smollm2_path.resolve()].ok
    assert not found[gemma_path.resolve()].ok


def test_auto_without_candidates_is_lookup_and_says_so(isolated: Path, gemma_path: Path) -> None:
    said: list[str] = []
    draft, _ = choose_drafter(EngineConfig(draft="auto"), "gemma3-270m", gemma_path, log=said.append)
    assert draft == LOOKUP
    assert len(said) == 1 and "prompt lookup" in said[0] and "no local GGUF has its tokenizer" in said[0]
