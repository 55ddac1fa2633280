"""A busy machine on demand: N CPU-bound background processes for the duration of a measurement.

`localspec bench --busy N` uses it to show what other programs' load does to plain
decoding, to speculation and to the thread choice. The hogs run in their own process group and are always
stopped: on return, on an exception, on Ctrl-C (try/finally) and on SIGTERM (turned into SystemExit while they
run). If this process dies without cleaning up, each hog notices its parent is gone and exits by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

# spin; every ~10^6 iterations check that the parent (its pid is argv[1]) still lives: an orphan exits by itself
HOG = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    for _ in range(1000000):\n        pass\n"


class Hogs:
    """Running background hogs (start/stop); `busy(n)` is the context-managed way to use them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def start(self) -> "Hogs":
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", HOG, str(os.getpid())], start_new_session=True,
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        return self

    def stop(self) -> None:
        """Kill every hog's process group and reap it; safe to call twice."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()

    @property
    def running(self) -> int:
        return sum(p.poll() is None for p in self.procs)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def busy(n: int) -> Iterator[Hogs]:
    """N CPU-bound processes while the block runs (n = 0: nothing)."""
    hogs = Hogs(n)
    old = signal.getsignal(signal.SIGTERM)
    main_thread = _in_main_thread()  # signal handlers can only be set there
    try:
        if n and main_thread:
            signal.signal(signal.SIGTERM, _raise_exit)
        yield hogs.start()
    finally:
        hogs.stop()
        if n and main_thread:
            signal.signal(signal.SIGTERM, old)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
