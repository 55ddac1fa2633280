"""A runner that dies of SIGSEGV in the middle of an answer, as a crash inside llama.cpp would, so the router's
handling of a dead runner is tested on a real process and a real signal.

With LOCALSPEC_FAULT_SEGV=MARKER in a process's environment and this folder on its PYTHONPATH (`env(MARKER)`),
sitecustomize.py wraps Engine.generate at start-up: the generation for a prompt whose text contains MARKER yields
its first two chunks, then the process kills itself with SIGSEGV. A streamed answer dies mid-stream, a whole
answer before it is sent. Other prompts are untouched. Nothing of this is in the localspec package.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Generator, Sequence

FAULT_ENV = "LOCALSPEC_FAULT_SEGV"
CHUNKS_BEFORE_CRASH = 2
FLUSH_S = 0.3  # time for the server to send the chunks already yielded before the process dies
HERE = Path(__file__).resolve().parent


def env(marker: str) -> dict[str, str]:
    """The environment a process (a router, whose runners inherit it, or a runner) needs for the fault."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {FAULT_ENV: marker, "PYTHONPATH": path}


def install(marker: str) -> None:
    """Wrap Engine.generate so that a prompt containing `marker` crashes the process after two chunks."""
    from localspec.engine.engine import Engine

    original = Engine.generate

    def generate(self: Engine, prompt: str | Sequence[int], **kw: Any) -> Generator:
        text = prompt if isinstance(prompt, str) else b"".join(self.target.piece(t) for t in prompt).decode(
            "utf-8", "replace")
        inner = original(self, prompt, **kw)
        return _crashing(inner) if marker in text else inner

    Engine.generate = generate  # type: ignore[method-assign]


def _crashing(chunks: Generator) -> Generator:
    """The chunks until the second, then SIGSEGV; the last chunk of an answer is never delivered."""
    for n, chunk in enumerate(chunks, 1):
        if chunk.finish is not None and n <= CHUNKS_BEFORE_CRASH:
            break
        yield chunk
        if n >= CHUNKS_BEFORE_CRASH:
            break
    time.sleep(FLUSH_S)
    os.kill(os.getpid(), signal.SIGSEGV)
    yield from ()


def install_from_env() -> None:
    marker = os.environ.get(FAULT_ENV)
    if marker:
        install(marker)
