"""`--draft FILE` with a DFlash drafter file: the loader recognises the file by its architecture, runs it beside the
target (not as a model of its own) and labels the drafter with the file's name; the greedy text is `--no-spec`'s,
with γ fixed (every round drafts a block) and with the adaptive controller. The fixtures are test_dflash.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_dflash import dflash_file
from test_eagle3 import qwen35_file
from test_eagle3_wiring import _run

from localspec.speculative.dflash import DFLASH


@pytest.mark.parametrize("flags", [("-k", "3", "--no-adaptive"), ()], ids=["fixed", "adaptive"])
def test_draft_file_drafts_with_the_dflash_file(smollm2_path: Path, flags: tuple[str, ...]):
    target, drafter = qwen35_file(smollm2_path, False), dflash_file(smollm2_path)
    spec = _run(target, "--draft", str(drafter), *flags)
    plain = _run(target, "--no-spec")
    assert spec["drafter"] in (drafter.name, drafter.name.removesuffix(".gguf"))
    assert spec["text"] == plain["text"]
    if flags:  # γ fixed at 3: every round drafts a block of 3
        assert spec["by_source"][DFLASH]["draft_n"] > 0
