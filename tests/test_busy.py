"""`bench --busy N`'s background hogs: they run while asked and are always stopped (return, error, Ctrl-C,
SIGTERM, and a parent that dies without cleaning up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from localspec.bench.busy import Hogs, busy


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().split()[2] != "Z"


def test_hogs_run_inside_and_stop_after():
    with busy(2) as hogs:
        pids = [p.pid for p in hogs.procs]
        assert hogs.running == 2
    assert not any(_alive(p) for p in pids)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_hogs_stop_on_error_and_ctrl_c(exc):
    pids = []
    with pytest.raises(exc):
        with busy(1) as hogs:
            pids = [p.pid for p in hogs.procs]
            raise exc()
    assert pids and not any(_alive(p) for p in pids)


def test_zero_hogs_is_a_no_op():
    with busy(0) as hogs:
        assert hogs.procs == []


def test_sigterm_stops_the_hogs():
    code = ("import sys, time\nfrom localspec.bench.busy import busy\nwith busy(1) as h:\n"
            "    print(h.procs[0].pid, flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    hog = int(p.stdout.readline())
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    assert not _alive(hog)


def test_orphaned_hogs_exit_by_themselves():
    hogs = Hogs(1)
    code = ("import time\nfrom localspec.bench.busy import Hogs\nh = Hogs(1).start()\n"
            "print(h.procs[0].pid, flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    hog = int(p.stdout.readline())
    p.kill()  # no cleanup runs
    p.wait()
    for _ in range(100):
        if not _alive(hog):
            break
        time.sleep(0.2)
    assert not _alive(hog) and hogs.procs == []
