"""A `localspec serve` app run in this process (uvicorn on port 0, in a thread), over an engine a test built:
for tests that reach into the engine (a slowed prefill) or read the worker while a request runs."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def load(model: Path, **load_options: Any) -> Any:
    """An Engine over `model` (2 threads, a 2048-token context), with the given LoadOptions fields."""
    from localspec.backend.loading import LoadOptions
    from localspec.engine.loader import EngineConfig, load_engine

    return load_engine(EngineConfig(model=str(model), n_ctx=2048, threads=2, load=LoadOptions(**load_options)),
                       log=lambda *a: None)


@contextmanager
def serving(engine: Any, **config: Any) -> Iterator[str]:
    """The app over `engine` with ServerConfig(**config), served until the block ends; yields its URL."""
    import uvicorn

    from localspec.server import ServerConfig, bind, create_app

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(engine, ServerConfig(**config)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the in-process server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
