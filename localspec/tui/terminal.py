"""The chat's terminal, and what the chat does when it goes away.

A closed terminal (a closed window, `tmux kill-session`) sends SIGHUP, then fails every write and reads as end
of file forever. Textual's output thread dies at its first failed write, after which the app blocks as soon as
30 writes wait for it, and its input thread spins on the end of file. So the chat writes through `QuietOutput`,
which drops what it cannot write, and ends (ChatApp.end) on SIGHUP, SIGTERM, SIGINT, and when it finds its
terminal hung up without a signal (`lifecycle.terminal_gone`, checked every CHECK_EVERY seconds).
"""

from __future__ import annotations

import signal
import sys
from typing import IO, Any, Callable

from textual.driver import Driver

from ..lifecycle import hangup_ignored, terminal_gone

CHECK_EVERY = 1.0  # seconds between checks that the terminal is still there
ENDS = ("SIGHUP", "SIGTERM", "SIGINT")  # the signals the chat ends on, its answer saved first


class QuietOutput:
    """A text file that stops writing after its first failed write (the terminal is gone), without an error."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                return self._file.write(text)
            except OSError:
                self.failed = True
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self._file.flush()
            except OSError:
                self.failed = True

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding ...
        return getattr(self._file, name)


def quiet_driver(base: type[Driver]) -> type[Driver]:
    """`base` writing through QuietOutput, where it is Textual's Linux driver (the one that writes to a file);
    any other driver as it is."""
    try:
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # Windows
        return base
    if not issubclass(base, LinuxDriver):
        return base

    class QuietLinuxDriver(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._file: Any = QuietOutput(self._file)

    return QuietLinuxDriver


def end_signals() -> list[signal.Signals]:
    """The signals to end on here: SIGHUP only where it is not ignored (nohup)."""
    return [s for name in ENDS if (s := getattr(signal, name, None)) is not None
            and not (name == "SIGHUP" and hangup_ignored())]


def watch(loop: Any, end: Callable[[], None]) -> bool:
    """Call `end` on the event loop when one of `end_signals` comes; False where the loop cannot (not the main
    thread, not POSIX)."""
    try:
        for sig in end_signals():
            loop.add_signal_handler(sig, end)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def terminal_fd() -> int | None:
    """The descriptor of the terminal the chat reads, None when stdin is not one."""
    stdin = sys.__stdin__
    try:
        return stdin.fileno() if stdin is not None and stdin.isatty() else None
    except (OSError, ValueError):
        return None


def hung_up(fd: int | None) -> bool:
    return fd is not None and terminal_gone(fd)
