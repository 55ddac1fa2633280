"""The `localspec` command runs in a forked child that its parent watches, so that a crash inside llama.cpp ends
with one line naming the likely cause and the option to try, instead of a bare "Segmentation fault".

Why a process: a fault in C code (a CPU kernel on an OpenMP worker thread) kills the process before any Python
handler could run. The parent only waits: it forwards signals sent to it by other processes (kill, a test's
terminate) to the child, leaves terminal signals (Ctrl-C reaches the whole foreground group) to the child alone,
exits with the child's code, and dies of the child's signal after printing its line, so the exit status is the
same as without it. The child dies with the parent (PR_SET_PDEATHSIG), so a killed parent leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable, NoReturn

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
WATCH_ENV = "LOCALSPEC_NO_WATCH"  # set (to anything): run in this process, unwatched
_PR_SET_PDEATHSIG = 1
_CRASHES = {signal.SIGSEGV: "segmentation fault", signal.SIGILL: "illegal instruction",
            signal.SIGBUS: "bus error", signal.SIGFPE: "arithmetic fault", signal.SIGABRT: "aborted"}


def crash_line(sig: int) -> str:
    """What to tell the user when the command died of `sig`."""
    name = signal.Signals(sig).name
    if sig == signal.SIGKILL:
        return (f"localspec: killed ({name}), often by the kernel's out-of-memory killer: try a smaller model, a "
                "smaller --ctx or a quantized KV cache (--cache-type-k q8_0)")
    what = _CRASHES.get(signal.Signals(sig), "killed")
    return (f"localspec: llama.cpp crashed ({name}, {what}), most likely in a CPU fast path this build gets wrong "
            "(AMX or repacked weights): try again with --no-repack; 'localspec models show MODEL' shows the CPU "
            "features in use")


def run_watched(main: Callable[[], object]) -> NoReturn:
    """Run `main` in a forked child and end as it ended (see the module docstring). Where fork is missing, or
    with LOCALSPEC_NO_WATCH set, `main` runs here."""
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
    status = _wait(pid)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in _CRASHES or sig == signal.SIGKILL:
            print(crash_line(sig), file=sys.stderr, flush=True)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status))


def die_with(parent: int) -> None:
    """Linux: the kernel sends this process SIGKILL when its parent dies (the router's runners use it too)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)


def _wait(pid: int) -> int:
    """Wait for the child, forwarding what other processes send; returns its wait status."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        info = signal.sigwaitinfo({*FORWARDED, signal.SIGCHLD})
        if info.si_signo != signal.SIGCHLD and info.si_pid not in (0, pid):  # 0: the terminal or the kernel
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass
