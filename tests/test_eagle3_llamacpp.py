"""The strong check for EAGLE-3 drafter files: on the same tiny target and drafter files (tests/tiny_eagle3.py),
prompt and draft length, localspec drafts the tokens llama.cpp's own `draft-eagle3` driver drafts, round by round,
and the target accepts as many of them.

It needs `llama-speculative-simple` built from the llama.cpp that llama-cpp-python vendors (docs/bench/mtp.md says
how); point LOCALSPEC_LLAMA_SPECULATIVE at it. Without it the test is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
from llamacpp_rounds import llama_cpp_rounds, localspec_rounds, needs_binary
from test_eagle3 import eagle3_file, qwen35_file

from localspec.backend import LoadOptions, Model
from localspec.backend.eagle3 import Eagle3Head
from localspec.speculative.eagle3 import Eagle3Drafter

pytestmark = needs_binary


def rounds_both(target: Path, drafter: Path, k: int):
    theirs = llama_cpp_rounds(["-m", str(target), "-md", str(drafter)], "draft-eagle3", k)
    ours = localspec_rounds(Model.load(target, LoadOptions(n_ctx=512)),
                            lambda t: Eagle3Drafter(Eagle3Head(t, drafter)), k)
    return theirs, ours


@pytest.fixture(scope="module", params=[False, True], ids=["random", "echo"])
def files(request: pytest.FixtureRequest, smollm2_path: Path) -> tuple[Path, Path]:
    return qwen35_file(smollm2_path, request.param), eagle3_file(smollm2_path, request.param)


@pytest.mark.parametrize("k", [1, 3])
def test_drafts_and_acceptance_match_llama_cpp(files: tuple[Path, Path], k: int):
    theirs, ours = rounds_both(*files, k)
    n = min(len(theirs), len(ours)) - 1  # the last round may be cut by what is left to generate, differently
    assert n >= 5
    assert ours[:n] == theirs[:n]
