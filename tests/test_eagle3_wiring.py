"""`--draft FILE` with an EAGLE-3 drafter file: the loader recognises the file by its architecture, runs it beside
the target (not as a model of its own) and labels the drafter with the file's name; the greedy text is `--no-spec`'s,
with γ fixed and with the adaptive controller, which starts the drafter's cost unknown and learns it online.

The fixtures are tests/tiny_eagle3.py's echo drafter for the echo qwen35 (drafts mostly accepted at first
positions), as tests/test_eagle3.py writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_eagle3 import eagle3_file, qwen35_file

from localspec.cli import main
from localspec.speculative.eagle3 import EAGLE3

PROMPT = "Write a short story about a robot who learns to paint."


def _run(path: Path, *flags: str, n: int = 24) -> dict:
    r = CliRunner().invoke(main, ["run", "--model", str(path), *flags, "-n", str(n), "--temp", "0", "--ctx", "512",
                                  "--threads", "1", "--json", PROMPT])
    assert r.exit_code == 0, r.output
    return json.loads(r.output.strip().splitlines()[-1])


@pytest.mark.parametrize("flags", [("-k", "3", "--no-adaptive"), ()], ids=["fixed", "adaptive"])
def test_draft_file_drafts_with_the_eagle3_file(smollm2_path: Path, flags: tuple[str, ...]):
    target, drafter = qwen35_file(smollm2_path, True), eagle3_file(smollm2_path, True)
    spec = _run(target, "--draft", str(drafter), *flags)
    plain = _run(target, "--no-spec")
    assert spec["drafter"] == drafter.name.removesuffix(".gguf") or spec["drafter"] == drafter.name
    assert spec["text"] == plain["text"]
    if flags:  # γ fixed at 3: every round drafts, and first drafts are accepted
        assert spec["by_source"][EAGLE3]["draft_n"] > 0
        assert spec["by_source"][EAGLE3]["draft_n_accepted"] > 0
