"""A real `localspec serve` in a subprocess on a free port, for the tests and scripts/editor/replay_editor.py
(which puts this folder on its path), and the body llama.vim sends one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

LLAMA_VIM_BODY = {  # what llama.vim's llama#fim sends (autoload/llama.vim), verbatim field for field
    "id_slot": 0,
    "input_prefix": "def add(a, b):\n",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"text": "import math\n", "time": 1700000000, "filename": "util.py"}],
    "prompt": "    return ",
    "n_predict": 16,
    "stop": [],
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.90,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                        "tokens_cached"],
}


_READY = re.compile(r"localspec serve: http://([^:\s]+):(\d+)")


ROUTED = ("--model", "-m", "--pair", "--router", "--models-dir", "--models-preset")


def _single_unless_routed(args: list[str]) -> list[str]:
    """A bare `localspec serve` is a router; the tests that start one mean the embedded default model alone."""
    return args if any(a.split("=")[0] in ROUTED for a in args) else ["--model", "smollm2-135m", *args]


class ServerProcess:
    """`with ServerProcess(["--ctx", "1024"]) as srv: srv.url` — the process is stopped on exit."""

    def __init__(self, args: list[str], *, timeout: float = 300.0, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.timeout = timeout
        # not PYTEST_CURRENT_TEST: it holds the test's id, and a test parametrized with a 300 KB grammar made the
        # environment too long to start a process (E2BIG) when it was the first to ask for a module's server
        self.env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "PYTEST_CURRENT_TEST"}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log: list[str] = []

    def __enter__(self) -> "ServerProcess":
        cmd = [sys.executable, "-m", "localspec", "serve", "--port", "0", *_single_unless_routed(self.args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=self.env, cwd=Path(__file__).resolve().parents[1])
        deadline = time.monotonic() + self.timeout
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            m = _READY.search(line)
            if m:
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                break
            if time.monotonic() > deadline:
                break
        if not self.url:
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.log[-20:]))
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + self.timeout  # loading took its share: a full window to answer /health
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server never became healthy:\n" + "".join(self.log[-20:]))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def rss_mib(pid: int) -> float:
    """Resident memory (MiB) of `pid` and its children, from /proc (Linux): `localspec serve` runs in a child
    its parent watches, so the server's memory is the tree's."""
    kids = [int(k) for t in Path(f"/proc/{pid}/task").iterdir() for k in (t / "children").read_text().split()]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024 + sum(rss_mib(k) for k in kids)
    return 0.0
