"""One model's runner: a normal single-model `localspec serve` in a child process that the router starts,
health-checks, talks to over HTTP on 127.0.0.1 and stops. The runner answers only the router: every route but
/health needs the secret the router made for it (its API key, handed over in its environment).

Why a process per model: speculation, the controller and its calibration then work per model exactly as in
single-model mode, and a crash inside llama.cpp (a SIGSEGV in a CPU kernel) kills one model, not the router.
The child runs unwatched (LOCALSPEC_NO_WATCH: the router is its watcher, so its exit status is the crash's own)
and dies with the router (PR_SET_PDEATHSIG=SIGKILL, crash.die_with, as the watched command's child does).
PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, so runners must be started from a thread
that lives as long as the router: the event loop's. (Linux only: elsewhere a router killed by SIGKILL leaves its
runners to be stopped by hand; any other end of the router stops them through Pool.close.)

A reader thread drains the child's output (stdout and stderr, merged): it learns the port from serve's ready
line, keeps the last lines for `failure()`, and reaps the child the moment its output ends, so a dead runner is
never left a zombie.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable

from ..crash import WATCH_ENV, crash_line, die_with
from .refusals import RunnerFailed

READY = re.compile(r"localspec serve: http://127\.0\.0\.1:(\d+)")
HOST = "127.0.0.1"
START_TIMEOUT = 600.0  # a load may fetch the embedded model and calibrate; a hung one is stopped after this
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
KEEP_LINES = 50
# the router checks the caller's API key; each runner gets a secret of its own in this variable instead (its
# environment, which only this user's processes may read, not its command line, which every user may)
KEY_ENV = "LOCALSPEC_API_KEY"
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT, signal.SIGKILL}


def _child_setup(parent: int) -> Callable[[], None] | None:
    """The child's preexec_fn: its own process group, so a terminal's Ctrl-C reaches the router alone (which
    stops its runners in order), and on Linux SIGKILL from the kernel when the forking thread of `parent`
    ends. A process group, not a session: on Linux a new session is also a new scheduler autogroup, which
    would give the runner a CPU share of its own against the router's; in one group the router and its
    runners share the CPU as a single-model server's threads do (on 2 cores, what that did to the hop was
    within the spread between runs: docs/bench/router.md#router-hop)."""
    if os.name != "posix":
        return None
    return functools.partial(_own_group, parent if sys.platform == "linux" else None)


def _own_group(parent: int | None) -> None:
    os.setpgid(0, 0)
    if parent is not None:
        die_with(parent)


def exit_cause(returncode: int, last_line: str, pid: int | None = None) -> str:
    """Why a runner ended, in one line: crash_line() for a crash or a kill (the OOM killer's SIGKILL),
    otherwise its signal or exit code and the last line it printed. `pid` is the runner's, so that a crash is
    blamed on what that runner noted it ran (flash attention on a GPU device) rather than the CPU's fast paths."""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        return crash_line(sig, pid) if sig in _CRASH_SIGNALS else f"runner killed by {sig.name}"
    return f"runner exited with code {returncode}" + (f": {last_line}" if last_line else "")


class Runner:
    """`await runner.start()`, then `runner.url`; `await runner.stop()` always leaves no process behind."""

    def __init__(self, name: str, args: tuple[str, ...], *, env: dict[str, str] | None = None,
                 on_line: Callable[[str], None] | None = None, start_timeout: float = START_TIMEOUT) -> None:
        self.name = name
        self.args = tuple(args)
        # the runner's key: it listens on 127.0.0.1, where any local process could otherwise use its model
        self.secret = secrets.token_urlsafe(32)
        self.env = {**os.environ, **(env or {}), WATCH_ENV: "1", KEY_ENV: self.secret}
        self.on_line = on_line  # each output line of the child (the router may echo them, prefixed)
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=KEEP_LINES)
        self.started_at: float | None = None  # time.time() when it answered /health
        self._proc: subprocess.Popen | None = None
        self._stopping = False
        self._crash: str | None = None  # the crash line, made once
        self._ready: asyncio.Event | None = None
        self._exited = threading.Event()

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "localspec", "serve", "--behind-router", "--host", HOST, "--port", "0",
                *self.args]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._exited.is_set() and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def failure(self) -> str | None:
        """Why the runner is gone (None while it runs, or when the router stopped it on purpose)."""
        rc = self.returncode
        if rc is None or self._stopping:
            return None
        if rc < 0:  # made once: crash_line takes the runner's suspect note, and the proxy and the pool both ask
            self._crash = self._crash or exit_cause(rc, "", self.pid)
            return self._crash
        return exit_cause(rc, next((ln for ln in reversed(tuple(self.lines)) if ln.strip()), ""))

    async def died(self, timeout: float = 2.0) -> str | None:
        """failure(), after waiting up to `timeout` for the process to end: a proxy whose connection broke asks
        this, since the socket closes a moment before the kernel reports the exit."""
        await asyncio.to_thread(self._exited.wait, timeout)
        return self.failure()

    async def start(self) -> None:
        """Start the child, wait for its ready line and a 200 from /health; RunnerFailed (it stopped) if it
        exits first or takes longer than start_timeout."""
        loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._crash = None
        self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=self.env, preexec_fn=_child_setup(os.getpid()))
        threading.Thread(target=self._drain, args=(loop, self._ready), daemon=True,
                         name=f"runner {self.name}").start()
        deadline = time.monotonic() + self.start_timeout
        try:
            await asyncio.wait_for(self._ready.wait(), self.start_timeout)
            if self.port is None:
                raise RunnerFailed(f"{self.name}: {self.failure()}")
            await self._healthy(deadline)
        except BaseException as e:
            cause = self.failure()
            await self.stop()
            if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
                raise RunnerFailed(f"{self.name}: not ready after {self.start_timeout:.0f} s") from None
            if isinstance(e, ConnectionError):
                raise RunnerFailed(f"{self.name}: {cause or e}") from None
            raise
        self.started_at = time.time()

    def _drain(self, loop: asyncio.AbstractEventLoop, ready: asyncio.Event) -> None:
        """The reader thread: output lines until EOF, then close the pipe and reap the child. The pipe is closed
        here rather than left to the garbage collector: a router that had restarted its runners a few dozen
        times held the pipe of every dead one (docs/bench/soak.md)."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        with proc.stdout:
            self._read(proc.stdout, loop, ready)
        proc.wait()
        self._exited.set()
        _set_soon(loop, ready)

    def _read(self, out: Iterable[bytes], loop: asyncio.AbstractEventLoop, ready: asyncio.Event) -> None:
        for raw in out:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if self.port is None and (m := READY.search(line)):
                self.port = int(m.group(1))
                _set_soon(loop, ready)
            if self.on_line is not None:
                try:
                    self.on_line(line)
                except Exception:  # an echo that fails must not stop the draining (and the reaping)
                    pass

    async def _healthy(self, deadline: float) -> None:
        while True:
            if not self.alive:
                raise ConnectionError("runner exited before /health answered")
            if await health(HOST, self.port or 0) == 200:
                return
            if time.monotonic() > deadline:
                raise TimeoutError
            await asyncio.sleep(0.05)

    def terminate(self) -> None:
        """SIGTERM now, without waiting: the runner ends its answers in flight and exits (`stop` reaps it)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._stopping = True
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, SIGKILL after `grace` seconds, and the process reaped (no zombie) in every case."""
        proc = self._proc
        if proc is None:
            return
        self._stopping = self._stopping or proc.poll() is None
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
            if proc.poll() is not None:
                break
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                await asyncio.to_thread(proc.wait, wait)
            except subprocess.TimeoutExpired:
                continue
        await asyncio.to_thread(self._exited.wait, 5.0)


def _set_soon(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:  # the loop is closed: nobody waits
        pass


async def health(host: str, port: int, timeout: float = 2.0) -> int | None:
    """The status code of GET /health, None when nothing answers: a plain socket, so the check needs no HTTP
    client and costs one small exchange."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        parts = status.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        writer.close()
