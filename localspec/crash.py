"""A process that died of a signal, told in one line, and what the watched command (commands/supervise.py) and
the router's runners (router/process.py) share beside it: a child that dies with its parent (die_with), and the
switch that runs a command unwatched (WATCH_ENV). Standard library only, below every layer that uses it.
"""

from __future__ import annotations

import ctypes
import os
import signal

WATCH_ENV = "LOCALSPEC_NO_WATCH"  # set (to anything): run in this process, unwatched
CRASHES = {signal.SIGSEGV: "segmentation fault", signal.SIGILL: "illegal instruction",
           signal.SIGBUS: "bus error", signal.SIGFPE: "arithmetic fault", signal.SIGABRT: "aborted"}
_PR_SET_PDEATHSIG = 1


def crash_line(sig: int) -> str:
    """What to tell the user when the command died of `sig`."""
    name = signal.Signals(sig).name
    if sig == signal.SIGKILL:
        return (f"localspec: killed ({name}), often by the kernel's out-of-memory killer: try a smaller model, a "
                "smaller --ctx or a quantized KV cache (--cache-type-k q8_0)")
    what = CRASHES.get(signal.Signals(sig), "killed")
    return (f"localspec: llama.cpp crashed ({name}, {what}), most likely in a CPU fast path this build gets wrong "
            "(AMX or repacked weights): try again with --no-repack; 'localspec models show MODEL' shows the CPU "
            "features in use")


def die_with(parent: int) -> None:
    """Linux: the kernel sends this process SIGKILL when its parent dies (the watched command's child, and the
    router's runners)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)
