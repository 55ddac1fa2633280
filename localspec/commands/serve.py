"""`localspec serve`: the llama.cpp/OpenAI/Ollama-compatible completion server (see docs/server.md)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import click

from ..lifecycle import port_holder
from . import router_mode
from .common import friendly_errors, log_err
from .options import engine_options


def _names(values: tuple[str, ...]) -> tuple[str, ...]:
    """Repeated options and comma-separated lists alike (llama-server's --alias a,b), in order, once each."""
    return tuple(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@click.command()
@friendly_errors
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address(es) to bind, comma-separated (localhost by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8012, show_default=True,
              help="Port (llama.vim's default; 0 = any free port).")
@click.option("--api-key", envvar="LOCALSPEC_API_KEY", metavar="KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--spec-max-queue", type=click.IntRange(0), default=4, show_default=True,
              help="With more requests waiting than this, new jobs decode without speculation.")
@click.option("--max-predict", type=click.IntRange(1), help="Cap on generated tokens per request.")
@click.option("-n", "--n-predict", "n_predict", type=click.IntRange(-1), metavar="N",
              help="Tokens a request generates when it does not say (-1 = until the context is full); not a cap.")
@click.option("--alias", multiple=True, metavar="NAME[,NAME..]",
              help="Model name(s) clients may use; the first is the one /v1/models and every response report.")
@click.option("--tags", multiple=True, metavar="TAG[,TAG..]", help="Informational tags listed in /v1/models.")
@click.option("--cors-origins", default="localhost", show_default=True, metavar="ORIGINS",
              help="Browser origins allowed: 'localhost' (any local port), '*', or a comma-separated list.")
@click.option("--context-shift/--no-context-shift", default=False, show_default=True,
              help="When a generation fills the context, drop the oldest tokens after the system prompt (n_keep) "
                   "and go on.")
@click.option("--router", is_flag=True, help="Router mode: serve every known model (models.toml, --models-dir, the "
              "hub cache, --models-preset), each in its own process; the default with --models-dir and no --model.")
@click.option("--models-max", type=click.IntRange(1), default=4, show_default=True,
              help="Router mode: models loaded at once; the least recently used idle one is unloaded past it.")
@click.option("--models-preset", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
              help="Router mode: [model-name] sections (INI or TOML) with each model's options (model, draft, ctx, "
                   "ngl ...), as llama-server's --models-preset.")
@click.option("--sleep-idle-seconds", type=click.FloatRange(0, min_open=True), metavar="N",
              help="Router mode: unload a model after N idle seconds; it wakes on the next request.")
@click.option("--keep-alive", envvar="OLLAMA_KEEP_ALIVE", default="5m", show_default=True, metavar="DURATION",
              help="Router mode: how long a model stays loaded after a request (Ollama's keep_alive; 0 = unload at "
                   "once, -1 = forever); a request's own keep_alive wins.")
@click.option("--models-autoload/--no-models-autoload", default=True, show_default=True,
              help="Router mode: a request for a model that is not running starts it; with --no-models-autoload "
                   "only POST /models/load (or Ollama's load request) does, as llama-server's option.")
@click.option("--default-model", metavar="NAME", help="Router mode: the model for requests that name none "
              "(llama.vim's /infill).")
@click.option("--chat-template-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
              help="A Jinja chat template that replaces the model's (llama-server's option): its tool-call syntax "
                   "decides how tools are offered and read.")
@click.option("--reasoning-format", type=click.Choice(["auto", "none", "deepseek"]), default="auto",
              show_default=True, help="<think> text: auto and deepseek move it to reasoning_content (Ollama's "
              "thinking), none leaves it in the content (llama-server's option).")
@click.option("--reasoning", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Thinking in chat templates that have a switch (enable_thinking): on unless off (llama-server's "
                   "option); a request's chat_template_kwargs wins.")
@click.option("--slots/--no-slots", default=True, show_default=True,
              help="llama-server's GET /slots (one slot: the generation worker); off: a 501.")
@click.option("--behind-router", is_flag=True, hidden=True,
              help="Set by the router for its runners: a stream's head goes out with its first piece.")
@engine_options
@click.pass_context
def serve(ctx, host, port, api_key, spec_max_queue, max_predict, n_predict, alias, tags, cors_origins, context_shift,
          router, models_max, models_preset, sleep_idle_seconds, keep_alive, models_autoload, default_model,
          chat_template_file, reasoning_format, reasoning, slots, behind_router, engine_config):
    """Serve completions over HTTP for editors (llama.vim, llama.vscode, Continue) and API clients.

    \b
    llama.cpp: POST /infill /completion /tokenize /detokenize /apply-template, GET /health /props /slots
    OpenAI:    POST /v1/completions /v1/chat/completions (/input_tokens), GET /v1/models
    Ollama:    POST /api/generate /api/chat, GET /api/tags /api/version
    Anthropic: POST /v1/messages /v1/messages/count_tokens;  Responses: POST /v1/responses
    Metrics:   GET /metrics (Prometheus)
    Router mode (no --model/--pair): every known model, chosen by each request's
    `model`; GET /models, POST /models/load /models/unload, GET /api/ps, POST /api/pull, DELETE /api/delete.
    Sampling options come with each request (llama.cpp/OpenAI/Ollama field names).
    """
    from ..engine.loader import load_engine
    from ..server import ServerConfig, bind
    from ..server import serve as run_server

    hosts = _names((host,))
    if not hosts:
        raise click.BadParameter("give at least one address", param_hint="--host")
    routing = router_mode.wanted(engine_config, router, models_preset)
    if not routing and sleep_idle_seconds is not None:  # llama-server sleeps its one model; not done here yet
        raise click.UsageError("--sleep-idle-seconds unloads idle models in router mode only: a single-model server "
                               "keeps its model loaded (drop --model to serve in router mode)")
    socks = _bind_all(bind, hosts, port)
    real_port = socks[0].getsockname()[1]
    if routing:
        return router_mode.run_router(ctx, engine_config, socks, ", ".join(_url(h, real_port) for h in hosts),
                                      api_key=api_key, cors_origins=cors_origins, models_max=models_max,
                                      sleep_idle_s=sleep_idle_seconds, keep_alive=keep_alive, presets=models_preset,
                                      default_model=default_model, autoload=models_autoload)
    engine = load_engine(engine_config, log=log_err)
    if chat_template_file:  # wins over models.toml's template and the GGUF's
        engine.chat_template = chat_template_file.read_text(encoding="utf-8")
    engine.thinking = reasoning != "off"
    how = f"{engine.drafter_name}, k={engine.controller.state().label}" if engine.drafter else "off"
    config = ServerConfig(api_key=api_key, spec_max_queue=spec_max_queue, max_predict=max_predict,
                          aliases=_names(alias), tags=_names(tags), n_predict=n_predict, cors_origins=cors_origins,
                          context_shift=context_shift, reasoning_format=reasoning_format, hold_heads=behind_router,
                          slots=slots)
    urls = ", ".join(_url(h, real_port) for h in hosts)
    try:
        run_server(engine, config, socks, on_ready=lambda: log_err(
            f"localspec serve: {urls} (model {engine.name}, speculation {how}, n_ctx {engine.target.n_ctx})"))
    finally:
        engine.close()


def _bind_all(bind, hosts: tuple[str, ...], port: int) -> list[socket.socket]:
    """Every address on one port: the first picks it when --port is 0, the others follow."""
    socks: list[socket.socket] = []
    for h in hosts:
        p = socks[0].getsockname()[1] if socks else port
        try:
            socks.append(bind(h, p))
        except OSError as e:
            for s in socks:
                s.close()
            held = port_holder(p) if e.errno == errno.EADDRINUSE else None
            by = f" by {held}" if held else ""
            raise click.ClickException(f"cannot listen on {h}:{p}: {e.strerror}{by}; pick another --port") from None
    return socks
