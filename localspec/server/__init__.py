"""HTTP completion server for editors and API clients: llama.cpp-, OpenAI- and Ollama-compatible routes over
one generation worker that owns the Engine (see app.py for the routes, worker.py for the threading rule)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .state import ServerConfig

__all__ = ["ServerConfig", "create_app", "bind", "serve"]


def __getattr__(name: str) -> Any:
    """ServerConfig and create_app load the engine (and llama.cpp) only when asked for: router mode imports
    localspec.server.http and must not load a model library it never runs."""
    if name == "ServerConfig":
        from .state import ServerConfig

        return ServerConfig
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so port 0 works and the real port can be printed. The protocol is named
    (IPPROTO_TCP) because asyncio only sets TCP_NODELAY on sockets that say so: without it each answer's body
    waits for the client's delayed ACK of its headers, 40 ms on a keep-alive connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve(engine: Engine, config: ServerConfig, socks: socket.socket | Sequence[socket.socket], *,
          log_level: str = "warning", on_ready: Callable[[], None] | None = None) -> None:
    """Run until interrupted. uvicorn with one process: the worker thread owns the models; one socket per
    --host address."""
    import uvicorn

    from .app import create_app
    from .limits import uvicorn_config

    app = create_app(engine, config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            """SIGTERM, SIGINT (and SIGHUP: lifecycle.py): the answers in flight end now, in their protocol's
            shape, rather than be cut when uvicorn's grace runs out."""
            app.state.localspec.worker.end_jobs()
            super().handle_exit(sig, frame)

    # no access log below info: uvicorn formats each request's line before the logger drops it
    server = Server(uvicorn_config(app, log_level=log_level, timeout_graceful_shutdown=2,
                                   access_log=log_level in ("trace", "debug", "info")))
    if on_ready is not None:
        on_ready()
    server.run(sockets=[socks] if isinstance(socks, socket.socket) else list(socks))
