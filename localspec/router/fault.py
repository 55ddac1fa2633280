"""A fault hook for tests only: make a runner die of SIGSEGV in the middle of an answer, as a crash inside
llama.cpp would, so the router's handling of a dead runner is tested on a real process and a real signal.

With LOCALSPEC_FAULT_SEGV=MARKER in a runner's environment (child.py installs this), the generation for a prompt
whose text contains MARKER yields its first two chunks, then the process kills itself with SIGSEGV: a streamed
answer dies mid-stream, a whole answer before it is sent. Other prompts are untouched, and without the variable
nothing is installed, so the normal path pays nothing.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Generator, Sequence

FAULT_ENV = "LOCALSPEC_FAULT_SEGV"
CHUNKS_BEFORE_CRASH = 2
FLUSH_S = 0.3  # time for the server to send the chunks already yielded before the process dies


def crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def install(marker: str) -> None:
    """Wrap Engine.generate so that a prompt containing `marker` crashes the process after two chunks."""
    from ..engine.engine import Engine

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
    crash()
    yield from ()


def install_from_env() -> None:
    marker = os.environ.get(FAULT_ENV)
    if marker:
        install(marker)
