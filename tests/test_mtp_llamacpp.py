"""The strong check: on the same tiny qwen35 files (one head) and step35 files (two chained heads), prompt and draft
length, localspec's MTP drafter drafts the tokens llama.cpp's own `draft-mtp` driver drafts, round by round, and the
target accepts as many of them.

It needs `llama-speculative-simple` built from the llama.cpp that llama-cpp-python vendors (docs/bench/mtp.md says
how); point LOCALSPEC_LLAMA_SPECULATIVE at it. Without it the test is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CACHE
from llamacpp_rounds import llama_cpp_rounds, localspec_rounds, needs_binary
from tiny_gguf import VERSION, write_qwen35_echo

from localspec.backend import LoadOptions, Model
from localspec.backend.mtp_chain import open_head
from localspec.speculative.mtp import MtpDrafter

pytestmark = needs_binary


def rounds_both(path: Path, k: int):
    theirs = llama_cpp_rounds(["-m", str(path)], "draft-mtp", k)
    ours = localspec_rounds(Model.load(path, LoadOptions(n_ctx=512, mtp=True)), lambda t: MtpDrafter(open_head(t)), k)
    return theirs, ours


@pytest.fixture(scope="module", params=["random", "echo-1.0"])
def fixture_path(request: pytest.FixtureRequest, smollm2_path: Path) -> Path:
    from tiny_gguf import file_name, write_tiny

    if request.param == "random":
        out = CACHE / "fixtures" / file_name("qwen35")
        return out if out.exists() else write_tiny("qwen35", smollm2_path, out)
    out = CACHE / "fixtures" / f"tiny-qwen35-echo-v{VERSION}-1.0.gguf"
    return out if out.exists() else write_qwen35_echo(smollm2_path, out, noise=1.0)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_drafts_and_acceptance_match_llama_cpp(fixture_path: Path, k: int):
    theirs, ours = rounds_both(fixture_path, k)
    n = min(len(theirs), len(ours)) - 1  # the last round may be cut by what is left to generate, differently
    assert n >= 5
    assert ours[:n] == theirs[:n]


@pytest.fixture(scope="module", params=["random", "echo-1.0"])
def step35_path(request: pytest.FixtureRequest, smollm2_path: Path) -> Path:
    from tiny_step35 import file_name, write_step35

    echo = None if request.param == "random" else 1.0
    out = CACHE / "fixtures" / file_name(echo)
    return out if out.exists() else write_step35(smollm2_path, out, echo=echo)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_chained_heads_draft_and_accept_as_llama_cpp(step35_path: Path, k: int):
    """Three chained heads: each draft position is its own head's (k 4 is cut to 3, one token per head, on both)."""
    theirs, ours = rounds_both(step35_path, k)
    n = min(len(theirs), len(ours)) - 1
    assert n >= 5
    assert ours[:n] == theirs[:n]
    assert max(len(draft) for draft, _ in ours[:n]) == min(k, 3)
