"""The strong check for EAGLE-3 drafter files: on the same tiny target and drafter files (tests/tiny_eagle3.py),
prompt and draft length, localspec drafts the tokens llama.cpp's own `draft-eagle3` driver drafts, round by round,
and the target accepts as many of them.

It needs `llama-speculative-simple` built from the llama.cpp that llama-cpp-python vendors (docs/bench/mtp.md says
how); point LOCALSPEC_LLAMA_SPECULATIVE at it. Without it the test is skipped."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from test_eagle3 import eagle3_file, qwen35_file

from localspec.backend import LoadOptions, Model
from localspec.backend.eagle3 import Eagle3Head
from localspec.speculative.eagle3 import Eagle3Drafter
from localspec.speculative.loop import generate
from localspec.speculative.types import Draft
from localspec.tuning.controller import FixedK

BINARY = os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE", "")
PROMPT = "Write a short story about a robot who learns to paint."
N_PREDICT = 40
pytestmark = pytest.mark.skipif(not Path(BINARY).is_file(), reason="LOCALSPEC_LLAMA_SPECULATIVE is not a binary")

_CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def llama_cpp_rounds(target: Path, drafter: Path, k: int) -> list[tuple[tuple[int, ...], int]]:
    """(drafted tokens, accepted count) per round of llama-speculative-simple, greedy, read from its debug log."""
    cmd = [BINARY, "-m", str(target), "-md", str(drafter), "--spec-type", "draft-eagle3", "--spec-draft-n-max",
           str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-p", PROMPT, "-n", str(N_PREDICT),
           "--temp", "0", "-c", "512", "-t", "1", "-v"]
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
    """The EAGLE-3 drafter, keeping each draft it proposes."""

    def __init__(self, inner: Eagle3Drafter) -> None:
        self.inner, self.drafts = inner, []
        self.name, self.sources, self.cost, self.prior = inner.name, inner.sources, inner.cost, inner.prior

    def propose(self, *args) -> Draft:
        d = self.inner.propose(*args)
        self.drafts.append(d.tokens)
        return d

    def close(self) -> None:
        self.inner.close()


def localspec_rounds(target_path: Path, drafter_path: Path, k: int) -> list[tuple[tuple[int, ...], int]]:
    target = Model.load(target_path, LoadOptions(n_ctx=512))
    target.set_threads(1, 1)
    d = _Recording(Eagle3Drafter(Eagle3Head(target, drafter_path)))
    try:
        prompt = target.tokenize(PROMPT, add_special=True, parse_special=True)
        steps = list(generate(target, prompt, drafter=d, controller=FixedK(k), max_tokens=N_PREDICT))
    finally:
        d.close()
        target.close()
    return [(draft, s.accepted) for draft, s in zip(d.drafts, steps)]


@pytest.fixture(scope="module", params=[False, True], ids=["random", "echo"])
def files(request: pytest.FixtureRequest, smollm2_path: Path) -> tuple[Path, Path]:
    return qwen35_file(smollm2_path, request.param), eagle3_file(smollm2_path, request.param)


@pytest.mark.parametrize("k", [1, 3])
def test_drafts_and_acceptance_match_llama_cpp(files: tuple[Path, Path], k: int):
    theirs, ours = llama_cpp_rounds(*files, k), localspec_rounds(*files, k)
    n = min(len(theirs), len(ours)) - 1  # the last round may be cut by what is left to generate, differently
    assert n >= 5
    assert ours[:n] == theirs[:n]
