"""How a localspec process ends, and what the next start finds of one that was killed (docs/design.md#signals).

A closed terminal sends SIGHUP. Python's default for it kills the process at once, which would cut a server's
answers mid-stream and lose the chat being written, and the child of a watching parent (commands/supervise.py)
would not hear of it at all: a terminal signals only its session's leader. So every localspec process treats
SIGHUP as SIGTERM: it ends, but in order. A process started with SIGHUP ignored (nohup) keeps running.

A terminal that was hung up reads as end of file forever and fails every write; a program that only reads it
spins. `terminal_gone` says whether that happened, for the chat to end instead.

A killed localspec leaves no lock file and no socket file (it creates none): the kernel frees its port, and its
children die with it. What it can leave is a half-written calibration entry, NAME.PID.tmp; `remove_stale`
deletes those whose writer is dead. A port another process holds is named by `port_holder`.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def end_on_hangup() -> None:
    """From now on SIGHUP does what SIGTERM does in this process, whatever handler SIGTERM has when it comes
    (uvicorn's graceful shutdown, the chat's save-and-exit, or the default end). Not where SIGHUP is ignored."""
    if not hasattr(signal, "SIGHUP") or signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return
    signal.signal(signal.SIGHUP, _as_terminate)


def _as_terminate(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGTERM)


def hangup_ignored() -> bool:
    """Whether this process was started with SIGHUP ignored (nohup): a closed terminal should not end it."""
    return hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def terminal_gone(fd: int) -> bool:
    """True once the terminal on `fd` was hung up (closed). False for a live terminal and for a file or pipe."""
    try:
        os.tcgetpgrp(fd)
    except OSError as e:
        return e.errno in (errno.EIO, errno.ENXIO)
    return False


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts: it is gone for every purpose here but its parent's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_name(path: Path) -> Path:
    """Where this process writes `path` before renaming it into place: NAME.PID.tmp, so that a writer killed
    half-way leaves a file the next start can tell is stale (`remove_stale`)."""
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def remove_stale(folder: Path) -> list[Path]:
    """Delete the NAME.PID.tmp files in `folder` whose writer is no longer running; returns those deleted."""
    gone: list[Path] = []
    try:
        found = list(folder.glob("*.tmp"))
    except OSError:
        return gone
    for p in found:
        pid = p.suffixes[-2][1:] if len(p.suffixes) >= 2 else ""
        if not pid.isdigit() or int(pid) == os.getpid() or alive(int(pid)):
            continue
        try:
            p.unlink()
            gone.append(p)
        except OSError:
            pass
    return gone


def port_holder(port: int) -> str | None:
    """Which process listens on TCP `port` on this machine: "pid N (its command line)", "another user's
    process" when its descriptors cannot be read, None when nothing listens or /proc cannot say (not Linux)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for proc in _PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        if any(_link(fd) in inodes for fd in fds):
            return f"pid {proc.name} ({_command(proc)})"
    return "another user's process"


def _link(fd: Path) -> str:
    """The socket inode a descriptor refers to, "" for anything else (or a descriptor closed meanwhile)."""
    try:
        link = os.readlink(fd)
    except OSError:
        return ""
    return link[8:-1] if link.startswith("socket:[") else ""


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes in /proc/net/tcp and tcp6 that listen (state 0A) on `port`."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _command(proc: Path) -> str:
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(" ".join(a.decode("utf-8", "replace").split()) for a in args if a)
    return text if len(text) <= 120 else text[:117] + "..."
