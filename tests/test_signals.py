"""Every localspec command ends with its terminal: the real commands run under a pseudo-terminal, the test closes
it (the kernel hangs it up and sends SIGHUP), and every process of the command must be gone, the chat being
answered saved as Esc saves it (docs/design.md#signals). The units: lifecycle.py's, and the supervisor's
forwarding of a hang-up that only it received."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from localspec import lifecycle

GONE_WITHIN = 30.0  # seconds: a bound for a failure to be reported, not a speed claim


# -- the units ------------------------------------------------------------------------------------------------

def test_a_hung_up_terminal_is_told_from_a_live_one_and_from_a_pipe():
    master, slave = os.openpty()
    try:
        assert not lifecycle.terminal_gone(slave)
        r, w = os.pipe()
        assert not lifecycle.terminal_gone(r)
        os.close(r), os.close(w)
    finally:
        os.close(master), os.close(slave)
    pid, fd = pty.fork()
    if pid == 0:  # the terminal's own process: it waits for the hang-up, then reports what it sees
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.write(1, b"ready\n")
        deadline = time.monotonic() + 20
        while not lifecycle.terminal_gone(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if lifecycle.terminal_gone(0) else 1)
    assert os.read(fd, 100).startswith(b"ready")
    os.close(fd)
    assert os.waitpid(pid, 0)[1] == 0


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"entry.json.{dead.pid}.tmp"
    mine = lifecycle.temp_name(tmp_path / "other.json")
    plain = tmp_path / "entry.json"
    for p in (stale, mine, plain):
        p.write_text("{}")
    assert lifecycle.remove_stale(tmp_path) == [stale]
    assert not stale.exists() and mine.exists() and plain.exists()


def test_the_process_holding_a_port_is_named():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        port = s.getsockname()[1]
        held = lifecycle.port_holder(port)
        if held is None and not Path("/proc/net/tcp").exists():
            pytest.skip("no /proc here")
        assert held is not None and held.startswith(f"pid {os.getpid()} (") and "python" in held
    finally:
        s.close()
    assert lifecycle.port_holder(port) is None


def test_the_supervisor_passes_on_a_hang_up_that_only_it_received(tmp_path):
    """A closed terminal signals its session's leader alone; when that is the watching parent, the child would
    never hear of it. Here the parent gets SIGHUP from the kernel (si_pid 0) as the terminal's leader."""
    code = ("import os, signal, sys, time\nfrom localspec.commands.supervise import run_watched\n"
            "def main():\n    os.write(1, b'ready\\n')\n    time.sleep(60)\nrun_watched(main)\n")
    cmd = _Terminal([sys.executable, "-c", code], _env(tmp_path))
    try:
        cmd.wait_for(b"ready")
        procs = cmd.processes()
        assert len(procs) == 2
        cmd.close()
        assert _all_gone(procs) == []
    finally:
        cmd.kill()


def _watched_code(body: str) -> str:
    return ("import os, signal, sys, time\nfrom localspec.commands.supervise import run_watched\n"
            f"def main():\n{body}\nrun_watched(main)\n")


def test_under_nohup_a_closed_terminal_ends_nothing(tmp_path):
    """SIGHUP ignored when the command started (nohup): a closed terminal leaves it running."""
    code = _watched_code("    os.write(1, b'ready\\n')\n    time.sleep(60)")
    cmd = _Terminal([sys.executable, "-c", code], _env(tmp_path), hangup_ignored=True)
    try:
        cmd.wait_for(b"ready")
        procs = cmd.processes()
        cmd.close()
        time.sleep(1.5)
        assert [_state(p) for p in procs] == ["S", "S"]
    finally:
        cmd.kill()


@pytest.mark.slow
def test_a_child_that_does_not_end_on_a_hang_up_is_killed(tmp_path):
    """Nobody is left to stop a program whose terminal closed: the watching parent kills a child that ignores
    SIGHUP after HANGUP_GRACE seconds, and ends as a hung-up process does."""
    code = _watched_code("    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n    signal.signal(signal.SIGTERM, "
                         "signal.SIG_IGN)\n    os.write(1, b'ready\\n')\n    time.sleep(60)")
    cmd = _Terminal([sys.executable, "-c", code], _env(tmp_path))
    try:
        cmd.wait_for(b"ready")
        procs = cmd.processes()
        cmd.close()
        time.sleep(2.0)
        assert _state(procs[1]) not in (None, "Z")  # it ignores the hang-up ...
        assert _all_gone(procs[1:]) == []  # ... until the grace is over
        _, status = os.waitpid(cmd.pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGHUP
    finally:
        cmd.kill()


# -- the real commands under a pseudo-terminal -------------------------------------------------------------------

ENDS = ["close", "sigterm", "ctrl-c"]  # a closed terminal, a kill, Ctrl-C typed


def _end(cmd: "_Terminal", how: str) -> None:
    if how == "close":
        cmd.close()
    elif how == "sigterm":
        os.kill(cmd.pid, signal.SIGTERM)  # another process's: the watching parent passes it on
    else:
        cmd.write(b"\x03")  # the terminal's Ctrl-C: SIGINT to the foreground group (the chat reads a key)


@pytest.mark.slow
@pytest.mark.parametrize("how", ENDS)
def test_a_closed_terminal_ends_the_chat_and_saves_the_answer_being_written(tmp_path, smollm2_path, how):
    """Closed, killed or Ctrl-C'd (the key stops the answer, twice more quits): the answer being written is
    saved as Esc saves it, and both processes are gone."""
    cmd = _Terminal([sys.executable, "-m", "localspec", "chat", "--model", str(smollm2_path), "-n", "4000",
                     "--temp", "0"], _env(tmp_path))
    db = tmp_path / "chats.sqlite"
    try:
        deadline = time.monotonic() + 300
        while not _rows(db, "SELECT role FROM messages") and time.monotonic() < deadline:
            # typed until the model is loaded and the prompt box takes it; Enter sends it
            cmd.write(b"Write a very long story about a dragon and a knight, in many chapters.\r")
            time.sleep(1.0)
        assert _rows(db, "SELECT role FROM messages") == [("user",)], cmd.screen()
        time.sleep(1.5)  # the answer is being written
        procs = cmd.processes()
        assert len(procs) == 2  # the watching parent and the chat
        _end(cmd, how)
        if how == "ctrl-c":
            time.sleep(1.0)
            cmd.write(b"\x03\x03")
        assert _all_gone(procs) == []
    finally:
        cmd.kill()
    answers = _rows(db, "SELECT content, stats FROM messages WHERE role = 'assistant'")
    assert len(answers) == 1 and answers[0][0].strip()  # saved as Esc saves a stopped answer: with its stats
    assert '"finish": "cancelled"' in answers[0][1]


@pytest.mark.slow
@pytest.mark.parametrize("nohup", [False, True])
def test_a_closed_terminal_ends_the_chat_while_its_model_loads(tmp_path, smollm2_path, nohup):
    """While the model loads (a worker thread the exit would wait for), and under nohup, where no SIGHUP comes
    and the chat finds its terminal hung up by itself."""
    cmd = _Terminal([sys.executable, "-m", "localspec", "chat", "--model", str(smollm2_path)], _env(tmp_path),
                    hangup_ignored=nohup)
    try:
        deadline = time.monotonic() + 120
        while len(cmd.out) < 2000 and time.monotonic() < deadline:  # the app drew its first screen
            time.sleep(0.05)
        procs = cmd.processes()
        cmd.close()
        assert _all_gone(procs) == []
    finally:
        cmd.kill()


@pytest.mark.slow
@pytest.mark.parametrize("how", ENDS)
def test_a_closed_terminal_ends_a_server_and_a_router_with_its_runner(tmp_path, smollm2_path, how):
    import httpx

    for args, n in ((["--model", str(smollm2_path)], 2), ([], 3)):  # supervisor + server; + router's runner
        cmd = _Terminal([sys.executable, "-m", "localspec", "serve", "--port", "0", *args], _env(tmp_path))
        try:
            port = int(cmd.wait_for(rb"localspec serve: http://127\.0\.0\.1:(\d+)").group(1))
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300,
                           json={"model": "smollm2-135m", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "Hi"}]})
            assert r.status_code == 200
            procs = cmd.processes()
            assert len(procs) == n, (args, procs)
            _end(cmd, how)
            assert _all_gone(procs) == [], args
        finally:
            cmd.kill()


@pytest.mark.slow
@pytest.mark.parametrize("how", ENDS)
def test_run_ends_with_its_terminal(tmp_path, smollm2_path, how):
    cmd = _Terminal([sys.executable, "-m", "localspec", "run", "--model", str(smollm2_path), "-n", "4000",
                     "Chapter 1. Once upon a time, in a land far away, there lived a dragon who"], _env(tmp_path))
    try:
        deadline = time.monotonic() + 300
        while len(cmd.processes()) < 2 or len(cmd.out) < 300:  # the watching parent, and the text coming
            assert time.monotonic() < deadline and _state(cmd.pid) not in (None, "Z"), cmd.screen()
            time.sleep(0.1)
        procs = cmd.processes()
        _end(cmd, how)
        assert _all_gone(procs) == []
    finally:
        cmd.kill()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one model", "router"])
def test_a_closed_terminal_ends_the_answers_in_flight_in_their_protocols_shape(tmp_path, smollm2_path, mode):
    """A stream being answered ends with its closing events (finish_reason, [DONE]), as far as it got; a request
    still waiting for the worker gets a 503 in its protocol's error shape; then every process is gone. In router
    mode the router tells its runner at once, and relays what the runner ends its answers with."""
    import json

    import httpx

    model = ["--model", str(smollm2_path), "--alias", "smollm2-135m"] if mode == "one model" else []
    cmd = _Terminal([sys.executable, "-m", "localspec", "serve", "--port", "0", *model], _env(tmp_path))
    streamed: list[str] = []
    waited: list[httpx.Response] = []

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=300, json={
                "model": "smollm2-135m", "stream": True, "max_tokens": 4000, "temperature": 0,
                "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}) as r:
            streamed.extend(line for line in r.iter_lines() if line)

    def whole() -> None:
        waited.append(httpx.post(f"{url}/api/generate", timeout=300, json={
            "model": "smollm2-135m", "prompt": "Hello", "stream": False, "options": {"num_predict": 8}}))

    try:
        url = "http://127.0.0.1:" + cmd.wait_for(rb"localspec serve: http://127\.0\.0\.1:(\d+)").group(1).decode()
        clients = [threading.Thread(target=stream), threading.Thread(target=whole)]
        clients[0].start()
        deadline = time.monotonic() + 300
        while len(streamed) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        clients[1].start()
        time.sleep(1.0)  # the second request waits behind the stream
        procs = cmd.processes()
        cmd.close()
        for c in clients:
            c.join(60)
        assert _all_gone(procs) == []
    finally:
        cmd.kill()
    assert streamed[-1] == "data: [DONE]"
    assert json.loads(streamed[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "stop"
    assert len(waited) == 1 and waited[0].status_code == 503 and "stopping" in waited[0].json()["error"]


@pytest.mark.slow
def test_a_runner_whose_router_died_exits(tmp_path, smollm2_path):
    """The router killed outright (SIGKILL: no handler runs, its pool stops nothing): its runner ends too
    (PR_SET_PDEATHSIG from the router's event-loop thread), and so does the watching parent."""
    import httpx

    cmd = _Terminal([sys.executable, "-m", "localspec", "serve", "--port", "0"], _env(tmp_path))
    try:
        port = int(cmd.wait_for(rb"localspec serve: http://127\.0\.0\.1:(\d+)").group(1))
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=300,
                       json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200
        procs = cmd.processes()
        supervisor, router, runner = procs
        os.kill(router, signal.SIGKILL)
        assert _all_gone([runner]) == [] and _all_gone(procs) == []
    finally:
        cmd.kill()


def test_a_second_server_on_a_taken_port_names_the_process_that_holds_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\ns = socket.socket()\n"
                               "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        r = subprocess.run([sys.executable, "-m", "localspec", "serve", "--port", str(port), "--model", "nothing"],
                           capture_output=True, text=True, timeout=120, env=_env(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode != 0
    line = r.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{port}" in line and f"by pid {holder.pid} (" in line and "pick another --port" in line


@pytest.mark.slow
def test_a_killed_server_leaves_its_port_to_the_next_start(tmp_path, smollm2_path):
    """SIGKILL to the watching parent: the server dies with it (PR_SET_PDEATHSIG), its port is free at once
    for the next start, even with a connection it had answered (SO_REUSEADDR past TIME_WAIT)."""
    import httpx

    port = 0
    for attempt in range(2):
        cmd = _Terminal([sys.executable, "-m", "localspec", "serve", "--port", str(port), "--model",
                         str(smollm2_path)], _env(tmp_path))
        try:
            port = int(cmd.wait_for(rb"localspec serve: http://127\.0\.0\.1:(\d+)").group(1))
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=60).status_code == 200
            procs = cmd.processes()
            os.kill(cmd.pid, signal.SIGKILL)
            assert _all_gone(procs) == []
        finally:
            cmd.kill()


# -- helpers ----------------------------------------------------------------------------------------------------

def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_NO_WATCH"}
    return env | {"LOCALSPEC_HOME": str(home), "TERM": "xterm-256color"}


class _Terminal:
    """A command as a terminal's own program (the session's leader, as `tmux new CMD` starts it), its output
    drained; `close()` closes the terminal as a closed window does."""

    def __init__(self, argv: list[str], env: dict[str, str], *, hangup_ignored: bool = False) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                # the signals as a terminal's shell leaves them (SIGHUP as nohup leaves it, if asked), whatever the
                # test run inherited: a run started in the background by a shell without job control ignores
                # SIGINT and SIGQUIT, and under nohup SIGHUP, and a program inherits what is ignored
                for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                if hangup_ignored:
                    signal.signal(signal.SIGHUP, signal.SIG_IGN)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.out = bytearray()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.closed = False

    def _read(self) -> None:
        while not self._stop.is_set():  # a read blocked on the master would keep the terminal open past close()
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.out.extend(data)

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def screen(self) -> str:
        return re.sub(rb"\x1b\[[0-9;?<>]*[a-zA-Z]", b"", bytes(self.out[-2000:])).decode("utf-8", "replace")

    def wait_for(self, pattern: bytes, timeout: float = 300.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if m := re.search(pattern, bytes(self.out)):
                return m
            assert _state(self.pid) not in (None, "Z"), self.screen()
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in: {self.screen()}")

    def processes(self) -> list[int]:
        """The command's process and its descendants."""
        children: dict[int, list[int]] = {}
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and (st := _stat(int(p.name))):
                children.setdefault(int(st[1]), []).append(int(p.name))
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def close(self) -> None:
        self._stop.set()
        self._reader.join()
        os.close(self.fd)
        self.closed = True

    def kill(self) -> None:
        """After a failure: nothing of the command outlives the test."""
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not self.closed:
            self.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _state(pid: int) -> str | None:
    st = _stat(pid)
    return st[0] if st else None


def _all_gone(procs: list[int]) -> list[int]:
    """Wait until none of `procs` runs (a zombie has ended: its parent may be a container's init that does not
    reap); returns those still running after GONE_WITHIN seconds."""
    deadline = time.monotonic() + GONE_WITHIN
    while True:
        try:
            os.waitpid(procs[0], os.WNOHANG)  # the test's own child
        except ChildProcessError:
            pass
        running = [p for p in procs if _state(p) not in (None, "Z")]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def _rows(db: Path, sql: str) -> list[tuple]:
    if not db.exists():
        return []
    con = sqlite3.connect(db, timeout=5)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the app has not made its tables yet
        return []
    finally:
        con.close()
