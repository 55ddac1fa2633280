"""The watched `localspec` process (supervise.py): a crash in the child ends in one line naming the likely cause,
with the child's own exit status; normal exits and signals from other processes pass through unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from localspec.commands.supervise import crash_line


def _watched(body: str, **kw) -> subprocess.Popen:
    code = ("import os, signal, sys, time\nfrom localspec.commands.supervise import run_watched\n"
            f"def main():\n{body}\nrun_watched(main)\n")
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_NO_WATCH"}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL, **kw)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGILL, signal.SIGABRT])
def test_a_crash_is_one_line_and_keeps_the_exit_status(sig):
    p = _watched(f"    print('working', flush=True)\n    os.kill(os.getpid(), {int(sig)})")
    out, err = p.communicate(timeout=60)
    assert p.returncode == -sig and out == "working\n"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [crash_line(sig)] and "--no-repack" in lines[0] and sig.name in lines[0]


def test_exit_codes_pass_through():
    p = _watched("    sys.exit(3)")
    assert p.wait(timeout=60) == 3 and p.stderr.read() == ""
    assert _watched("    pass").wait(timeout=60) == 0


def _signal_state(pid: int) -> str:
    """What the kernel says of a process's signals and state, and of its children's (Linux), for a failure."""
    out = []
    for q in [pid, *_children(pid)]:
        try:
            lines = open(f"/proc/{q}/status").read().splitlines()
        except OSError:
            out.append(f"{q}: gone")
            continue
        keep = [ln for ln in lines if ln.split(":")[0] in ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")]
        out.append(f"{q}: " + "; ".join(ln.replace("\t", " ") for ln in keep))
    return "\n".join(out)


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def test_signals_from_other_processes_reach_the_child():
    p = _watched("    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n    print('ready', flush=True)\n"
                 "    time.sleep(60)")
    assert p.stdout.readline() == "ready\n"
    p.terminate()
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:  # seen once in a full run, never alone: say where the signal stopped
        state = _signal_state(p.pid)
        p.kill()
        p.wait(timeout=30)
        pytest.fail(f"not ended 30 s after SIGTERM; parent and child:\n{state}\nstderr: {p.stderr.read()!r}")
    assert rc == 7, p.stderr.read()


def test_a_killed_parent_takes_the_child_with_it(tmp_path):
    pidfile = tmp_path / "child"
    p = _watched(f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n    time.sleep(60)")
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    p.kill()
    p.wait(timeout=30)
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail("the child outlived its killed parent")
