"""A runner's process, seen from the router (router/process.py): once it ended, whether it crashed or was
stopped, the router holds nothing of it open. The soak found one pipe left per dead runner (docs/bench/soak.md).
"""

from __future__ import annotations

import os
import sys

import pytest

from localspec.router.process import Runner
from localspec.router.refusals import RunnerFailed


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class Crashing(Runner):
    """A child that prints a line and dies of SIGSEGV before it is ready."""

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import os, signal; print('loading', flush=True); "
                "os.kill(os.getpid(), signal.SIGSEGV)"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc (Linux)")
async def test_a_runner_that_ended_leaves_no_descriptor_open():
    before = _fds()
    kept = []  # held, as a request's frames or the pool may hold a runner after its process ended
    for _ in range(3):
        runner = Crashing("crashes", ())
        with pytest.raises(RunnerFailed, match="SIGSEGV"):
            await runner.start()
        assert "SIGSEGV" in (await runner.died() or "") and runner.lines[-1] == "loading"
        kept.append(runner)
    assert _fds() - before == set()
