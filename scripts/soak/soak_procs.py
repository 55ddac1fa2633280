"""What the soak (scripts/soak/soak.py) reads of a server's processes from /proc: open descriptors, threads, resident
memory and state, the process tree, and whether anything is left after the server stopped. Linux only.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    """One process at one moment. `fds` counts /proc/PID/fd entries (sockets, pipes, files, eventfds)."""

    role: str  # supervisor, router, server, or the runner's model name
    pid: int
    fds: int
    threads: int
    rss_mib: float
    state: str  # the kernel's one-letter state: R, S, Z ...

    def row(self) -> dict:
        return asdict(self)


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def sample(role: str, pid: int) -> Sample | None:
    """The process's numbers now, or None when it is gone."""
    try:
        st = _status(pid)
        fds = len(os.listdir(PROC / str(pid) / "fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss = int(st.get("VmRSS", "0 kB").split()[0]) / 1024  # a zombie has no VmRSS
    return Sample(role, pid, fds, int(st.get("Threads", "0")), round(rss, 1), st.get("State", "?")[:1])


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's), empty when it is gone."""
    kids: list[int] = []
    try:
        for task in (PROC / str(pid) / "task").iterdir():
            kids += [int(k) for k in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []
    return kids


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for k in children(pid):
        out += [k, *descendants(k)]
    return out


def state(pid: int) -> str | None:
    """The process's state letter (Z for a zombie), or None when no such process exists."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def zombies(pids: list[int]) -> list[int]:
    return [p for p in pids if state(p) == "Z"]


def left_over(pids: set[int]) -> list[tuple[int, str]]:
    """Those of `pids` that still exist (alive or zombie), with their state: after a stop, none should."""
    return [(p, s) for p in sorted(pids) if (s := state(p)) is not None]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a new server could listen on `port` now: nothing listens there. SO_REUSEADDR, as
    localspec's own bind sets it: connections of the old server in TIME_WAIT do not hold the port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = (float(x) for x in (PROC / "loadavg").read_text().split()[:3])
    return one, five, fifteen
