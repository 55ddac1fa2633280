"""`localspec serve`: the llama.cpp/OpenAI/Ollama-compatible completion server (see docs/server.md)."""

from __future__ import annotations

import click

from .common import friendly_errors, log_err
from .options import engine_options


@click.command()
@friendly_errors
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (localhost by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8012, show_default=True,
              help="Port (llama.vim's default; 0 = any free port).")
@click.option("--api-key", envvar="LOCALSPEC_API_KEY", metavar="KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--spec-max-queue", type=click.IntRange(0), default=4, show_default=True,
              help="With more requests waiting than this, new jobs decode without speculation.")
@click.option("--max-predict", type=click.IntRange(1), help="Cap on generated tokens per request.")
@click.option("--alias", metavar="NAME", help="The model name /v1/models, /api/tags and every response report.")
@engine_options
def serve(host, port, api_key, spec_max_queue, max_predict, alias, spec):
    """Serve completions over HTTP for editors (llama.vim, llama.vscode, Continue) and API clients.

    \b
    llama.cpp: POST /infill /completion /tokenize /detokenize /apply-template, GET /health /props
    OpenAI:    POST /v1/completions /v1/chat/completions, GET /v1/models
    Ollama:    POST /api/generate /api/chat, GET /api/tags /api/version
    Metrics:   GET /metrics (Prometheus)
    Sampling options come with each request (llama.cpp/OpenAI/Ollama field names).
    """
    from ..engine.loader import load_engine
    from ..server import ServerConfig, bind
    from ..server import serve as run_server

    try:
        sock = bind(host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror}; pick another --port") from None
    engine = load_engine(spec, log=log_err)
    real_port = sock.getsockname()[1]
    how = f"{engine.drafter_name}, k={engine.controller.state().label}" if engine.drafter else "off"
    config = ServerConfig(api_key=api_key, spec_max_queue=spec_max_queue, max_predict=max_predict, alias=alias)
    try:
        run_server(engine, config, sock, on_ready=lambda: log_err(
            f"localspec serve: http://{host}:{real_port} (model {engine.name}, speculation {how}, "
            f"n_ctx {engine.target.n_ctx})"))
    finally:
        engine.close()
