"""The `localspec` command runs in a forked child that its parent watches, so that a crash inside llama.cpp ends
with one line naming the likely cause and the option to try, instead of a bare "Segmentation fault".

Why a process: a fault in C code (a CPU kernel on an OpenMP worker thread) kills the process before any Python
handler could run. The parent only waits: it forwards signals sent to it by other processes (kill, a test's
terminate) to the child, leaves Ctrl-C and Ctrl-\\ to the child alone (the terminal sends them to the whole
foreground group), exits with the child's code, and dies of the child's signal after printing its line, so the
exit status is the same as without it. The child dies with the parent (PR_SET_PDEATHSIG), so a killed parent
leaves nothing behind.

A closed terminal sends SIGHUP to the session's leader only, which is this parent when the command was the
terminal's own (`tmux new 'localspec chat'`): so SIGHUP is forwarded whoever sent it, and a child still running
HANGUP_GRACE seconds later is killed, since nobody is left to see it or to stop it. Both processes treat SIGHUP
as SIGTERM (lifecycle.end_on_hangup), unless the command was started with it ignored (nohup).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable, NoReturn

from ..crash import CRASHES, WATCH_ENV, crash_line, die_with
from ..lifecycle import end_on_hangup, hangup_ignored

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HANGUP_GRACE = 10.0  # seconds a child has to end after a hang-up (it saves a chat, finishes answers) before SIGKILL


def run_watched(main: Callable[[], object]) -> NoReturn:
    """Run `main` in a forked child and end as it ended (see the module docstring). Where fork is missing, or
    with LOCALSPEC_NO_WATCH set, `main` runs here."""
    end_on_hangup()
    if not hasattr(os, "fork") or not hasattr(signal, "sigwaitinfo") or os.environ.get(WATCH_ENV):
        main()
        sys.exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        die_with(parent)
        main()
        sys.exit(0)
    status, hung_up = _wait(pid)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if hung_up and sig == signal.SIGKILL:  # killed here after a hang-up: end as a hung-up process does
            sig = signal.SIGHUP
        elif sig in CRASHES or sig == signal.SIGKILL:
            _say(crash_line(sig, pid))
        _die_of(sig)
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status))


def _die_of(sig: int) -> None:
    """End this process by `sig`, as the child ended. SIGKILL and SIGSTOP keep their default action and may not be
    given a handler (signal.signal raises for them), so only the others are reset and unblocked first."""
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone
        pass


def _wait(pid: int) -> tuple[int, bool]:
    """Wait for the child, forwarding what other processes send and a hang-up; returns its wait status and
    whether it was killed here, HANGUP_GRACE seconds after a hang-up it did not end on."""
    waited = {*FORWARDED, signal.SIGCHLD}
    hangups = not hangup_ignored()
    deadline: float | None = None
    killed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, killed
        if deadline is None:
            info = signal.sigwaitinfo(waited)
        else:
            got = signal.sigtimedwait(waited, max(0.0, deadline - time.monotonic()))
            if got is None:  # the grace after a hang-up is over
                _send(pid, signal.SIGKILL)
                deadline, killed = None, True
                continue
            info = got
        sig = info.si_signo
        if sig == signal.SIGCHLD or info.si_pid == pid:
            continue
        if sig == signal.SIGHUP:
            if not hangups:
                continue
            if deadline is None and not killed:
                deadline = time.monotonic() + HANGUP_GRACE
            _send(pid, sig)
        elif info.si_pid != 0:  # 0: the terminal (Ctrl-C reached the child too) or the kernel
            _send(pid, sig)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
