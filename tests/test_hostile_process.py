"""The watching parent of a child killed by SIGKILL (the OOM killer's signal) ends as the child did: killed by
SIGKILL, with its one line and no traceback (signal.signal(SIGKILL, ...) is not allowed and raised before)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

CHILD = """
import os, signal
from localspec.commands.supervise import run_watched
run_watched(lambda: os.kill(os.getpid(), signal.{sig}))
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGSEGV"])
def test_the_parent_dies_of_the_childs_signal_without_a_traceback(sig):
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_NO_WATCH"}
    proc = subprocess.run([sys.executable, "-c", CHILD.format(sig=sig)], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == -getattr(signal, sig), proc.stderr
    assert "Traceback" not in proc.stderr
    if sig in ("SIGKILL", "SIGSEGV"):
        assert proc.stderr.strip(), "a crash or a kill gets its one line"
