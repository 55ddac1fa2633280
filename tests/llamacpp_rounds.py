"""Round-by-round drafts from llama.cpp's own speculative driver and from localspec's loop, for the strong checks
(tests/test_mtp_llamacpp.py, tests/test_eagle3_llamacpp.py): on the same files, prompt and draft length, both must
draft the same tokens and the target accept as many of them.

`llama-speculative-simple` built from the llama.cpp that llama-cpp-python vendors (docs/bench/mtp.md says how) is
read from LOCALSPEC_LLAMA_SPECULATIVE; the tests skip without it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Callable, Sequence

import pytest

from localspec.backend import Model
from localspec.speculative.loop import generate
from localspec.speculative.types import Draft, Drafter
from localspec.tuning.fixed import FixedK

BINARY = os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE", "")
PROMPT = "Write a short story about a robot who learns to paint."
N_PREDICT = 40
needs_binary = pytest.mark.skipif(not Path(BINARY).is_file(), reason="LOCALSPEC_LLAMA_SPECULATIVE is not a binary")

Rounds = list[tuple[tuple[int, ...], int]]  # (drafted tokens, accepted count) per round

_CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def llama_cpp_rounds(models: Sequence[str], spec_type: str, k: int) -> Rounds:
    """llama-speculative-simple's rounds, greedy, read from its debug log; `models` are its -m (and -md) arguments."""
    cmd = [BINARY, *models, "--spec-type", spec_type, "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-p", PROMPT, "-n", str(N_PREDICT), "--temp", "0", "-c", "512", "-t", "1", "-v"]
    out = subprocess.run(cmd, capture_output=True, timeout=300)
    log = out.stderr.decode("utf-8", "replace")  # token pieces can be parts of a UTF-8 character
    assert out.returncode == 0, log[-2000:]
    rounds: Rounds = []
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


class Recording:
    """A drafter that keeps each draft it proposes."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.drafts: list[tuple[int, ...]] = []
        self.name, self.sources, self.cost, self.prior = inner.name, inner.sources, inner.cost, inner.prior

    def propose(self, *args) -> Draft:
        d = self.inner.propose(*args)
        self.drafts.append(d.tokens)
        return d

    def close(self) -> None:
        self.inner.close()


def localspec_rounds(target: Model, make_drafter: Callable[[Model], Drafter], k: int) -> Rounds:
    """localspec's rounds on `target` (closed after), greedy at a fixed k, one thread as llama.cpp's run."""
    target.set_threads(1, 1)
    d = Recording(make_drafter(target))
    try:
        prompt = target.tokenize(PROMPT, add_special=True, parse_special=True)
        steps = list(generate(target, prompt, drafter=d, controller=FixedK(k), max_tokens=N_PREDICT))
    finally:
        d.close()
        target.close()
    return [(draft, s.accepted) for draft, s in zip(d.drafts, steps)]
