"""What the machine offers and how busy it is: the cores this process may use, the cores other programs are
using right now, and the OpenMP settings in force. The thread controller (threads.py) decides with these;
nothing here decides anything."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Callable


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_model() -> str:
    """The CPU's name (calibrations and fast-path verdicts are kept per CPU)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# OpenMP: libgomp's long default spin hurts only when a decode's threads outnumber the free cores, which the thread
# controller avoids once the CPU meter says busy, so localspec sets nothing (docs/bench/threads.md#openmp).


def openmp_settings() -> dict[str, str | None]:
    """The OpenMP settings in force (step times depend on them: part of the calibration cache key)."""
    return {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}


class CpuMeter:
    """How many cores the rest of the machine is using: the busy time in /proc/stat less this process's own CPU
    time, over the interval since the last reading (at least `every_s`). Linux only; elsewhere `others()` is
    always None and the thread choosers rely on step times."""

    STAT = "/proc/stat"

    def __init__(self, every_s: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last = self._read()
        self.latest: float | None = None  # the last reading, handed out again to a caller who asks too soon

    def _read(self) -> tuple[float, float, float] | None:
        """(when, machine busy seconds, this process's CPU seconds), or None without /proc/stat."""
        try:
            with open(self.STAT, encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields[:8]) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
        return self.clock(), busy / self.hz, time.process_time()

    def others(self) -> float | None:
        """Cores used by other processes since the last reading (asked sooner than `every_s` after it: that
        reading again, so two readers, calibration and the thread controller, never starve each other); None
        without /proc/stat or before the first interval has passed."""
        if self.last is None or self.clock() - self.last[0] < self.every_s:
            return self.latest
        now = self._read()
        if now is None:
            return self.latest
        (t0, b0, p0), (t1, b1, p1) = self.last, now
        self.last = now
        self.latest = max(0.0, ((b1 - b0) - (p1 - p0)) / max(t1 - t0, 1e-9))
        return self.latest


def free_cores(cores: int, others: float) -> int:
    """The cores other programs leave this one (at least one): how many threads a busy machine can run
    without a thread waiting at every barrier for a core the scheduler gave someone else."""
    return max(1, int(cores - others + 0.5))
