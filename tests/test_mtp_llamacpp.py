"""The strong check: on the same tiny qwen35 files (one head) and step35 files (two chained heads), prompt and draft
length, localspec's MTP drafter drafts the tokens llama.cpp's own `draft-mtp` driver drafts, round by round, and the
target accepts as many of them.

It needs `llama-speculative-simple` built from the llama.cpp that llama-cpp-python vendors (docs/bench/mtp.md says
how); point LOCALSPEC_LLAMA_SPECULATIVE at it. Without it the test is skipped."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import CACHE
from tiny_gguf import VERSION, write_qwen35_echo

from localspec.backend import LoadOptions, Model
from localspec.backend.mtp_chain import open_head
from localspec.speculative.loop import generate
from localspec.speculative.mtp import MtpDrafter
from localspec.speculative.types import Draft
from localspec.tuning.controller import FixedK

BINARY = os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE", "")
PROMPT = "Write a short story about a robot who learns to paint."
N_PREDICT = 40
pytestmark = pytest.mark.skipif(not Path(BINARY).is_file(), reason="LOCALSPEC_LLAMA_SPECULATIVE is not a binary")

_CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def llama_cpp_rounds(path: Path, k: int) -> list[tuple[tuple[int, ...], int]]:
    """(drafted tokens, accepted count) per round of llama-speculative-simple, greedy, read from its debug log."""
    cmd = [BINARY, "-m", str(path), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k),
           "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-p", PROMPT, "-n", str(N_PREDICT), "--temp", "0",
           "-c", "512", "-t", "1", "-v"]
    out = subprocess.run(cmd, capture_output=True, timeout=300)
    log = out.stderr.decode("utf-8", "replace")  # token pieces can be parts of a UTF-8 character
    assert out.returncode == 0, log[-2000:]
    rounds: list[tuple[tuple[int, ...], int]] = []
    draft: list[int] = []
    for line in log.splitlines():
        if m := _CANDIDATE.search(line):
            draft.append(int(m.group(2)))
        elif m := _ACCEPTED.search(line):  # a draft cut to what is left to generate logs its cut tokens too
            n = int(m.group(2))
            assert n <= len(draft), line
            rounds.append((tuple(draft[:n]), int(m.group(1))))
            draft = []
    return rounds


class _Recording:
    """The MTP drafter, keeping each draft it proposes."""

    def __init__(self, inner: MtpDrafter) -> None:
        self.inner, self.drafts = inner, []
        self.name, self.sources, self.cost, self.prior = inner.name, inner.sources, inner.cost, inner.prior

    def propose(self, *args) -> Draft:
        d = self.inner.propose(*args)
        self.drafts.append(d.tokens)
        return d

    def close(self) -> None:
        self.inner.close()


def localspec_rounds(path: Path, k: int) -> list[tuple[tuple[int, ...], int]]:
    target = Model.load(path, LoadOptions(n_ctx=512, mtp=True))
    target.set_threads(1, 1)
    d = _Recording(MtpDrafter(open_head(target)))
    try:
        prompt = target.tokenize(PROMPT, add_special=True, parse_special=True)
        steps = list(generate(target, prompt, drafter=d, controller=FixedK(k), max_tokens=N_PREDICT))
    finally:
        d.close()
        target.close()
    return [(draft, s.accepted) for draft, s in zip(d.drafts, steps)]


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
    theirs, ours = llama_cpp_rounds(fixture_path, k), localspec_rounds(fixture_path, k)
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
    theirs, ours = llama_cpp_rounds(step35_path, k), localspec_rounds(step35_path, k)
    n = min(len(theirs), len(ours)) - 1
    assert n >= 5
    assert ours[:n] == theirs[:n]
    assert max(len(draft) for draft, _ in ours[:n]) == min(k, 3)
