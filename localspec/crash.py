"""A process that died of a signal, told in one line, and what the watched command (commands/supervise.py) and
the router's runners (router/process.py) share beside it: a child that dies with its parent (die_with), and the
switch that runs a command unwatched (WATCH_ENV). Standard library only, below every layer that uses it.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

WATCH_ENV = "LOCALSPEC_NO_WATCH"  # set (to anything): run in this process, unwatched
CRASHES = {signal.SIGSEGV: "segmentation fault", signal.SIGILL: "illegal instruction",
           signal.SIGBUS: "bus error", signal.SIGFPE: "arithmetic fault", signal.SIGABRT: "aborted"}
_PR_SET_PDEATHSIG = 1


def crash_line(sig: int, pid: int | None = None) -> str:
    """What to tell the user when the command died of `sig`; `pid`: the child that died, whose suspect (what it
    ran on a GPU device, `note_suspect`) is named instead of the CPU's fast paths."""
    name = signal.Signals(sig).name
    if sig == signal.SIGKILL:
        return (f"localspec: killed ({name}), often by the kernel's out-of-memory killer: try a smaller model, a "
                "smaller --ctx or a quantized KV cache (--cache-type-k q8_0)")
    what = CRASHES.get(signal.Signals(sig), "killed")
    suspect = _take_suspect(pid) if pid else None
    if suspect:
        where, hint = suspect
        return f"localspec: llama.cpp crashed ({name}, {what}), most likely in {where}: try again with {hint}"
    return (f"localspec: llama.cpp crashed ({name}, {what}), most likely in a CPU fast path this build gets wrong "
            "(AMX or repacked weights): try again with --no-repack; 'localspec models show MODEL' shows the CPU "
            "features in use")


def _suspect_path(parent: int, child: int) -> Path:
    return Path(tempfile.gettempdir()) / f"localspec-suspect-{parent}-{child}"


def note_suspect(where: str | None, hint: str = "") -> None:
    """Name what this process runs that may crash it besides the CPU ("flash attention on Vulkan0", with the hint
    "--flash-attn off"), for the crash line its watching parent writes; None: nothing (the file goes)."""
    p = _suspect_path(os.getppid(), os.getpid())
    try:
        if where:
            p.write_text(f"{where}\n{hint}")
            atexit.register(p.unlink, missing_ok=True)  # a process that ends normally leaves nothing behind
        else:
            p.unlink(missing_ok=True)
    except OSError:
        pass  # the crash line then names the CPU's fast paths


@contextmanager
def suspected(where: str, hint: str) -> Iterator[None]:
    """Name `where` as the suspect while the block runs (llama.cpp parsing a request's grammar), then put back
    what was noted before."""
    p = _suspect_path(os.getppid(), os.getpid())
    try:
        before = p.read_text() if p.exists() else None
        p.write_text(f"{where}\n{hint}")
    except OSError:
        before = None
    try:
        yield
    finally:
        try:
            p.write_text(before) if before is not None else p.unlink(missing_ok=True)
        except OSError:
            pass


def _take_suspect(child: int) -> tuple[str, str] | None:
    p = _suspect_path(os.getpid(), child)
    try:
        where, _, hint = p.read_text().partition("\n")
        p.unlink()
    except OSError:
        return None
    return (where, hint or "--ngl 0") if where else None


def die_with(parent: int) -> None:
    """Linux: the kernel sends this process SIGKILL when its parent dies (the watched command's child, and the
    router's runners)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)
