"""`localspec serve` in router mode: every model this machine knows, each in its own runner process (a normal
single-model `localspec serve`) that starts on the first request naming it (docs/server.md#router-mode).

Why here and not in serve.py: serve's single-model path stays as it was; this module turns the same options into
the router's (RouterConfig, the pool's limits) and each runner's command line (the engine options and the
per-request serve options the user gave, so every model is served as `localspec serve --model X ...` would).
"""

from __future__ import annotations

import re
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from .common import log_err

# serve's own options that a runner does not get: the router listens, checks keys and CORS, names the models
ROUTER_ONLY = {"host", "port", "api_key", "alias", "tags", "cors_origins", "models_max", "sleep_idle_seconds",
               "models_preset", "keep_alive", "default_model", "router"}
_SERVE_PASSED = {"spec_max_queue": "--spec-max-queue", "max_predict": "--max-predict", "n_predict": "--n-predict",
                 "chat_template_file": "--chat-template-file", "reasoning_format": "--reasoning-format",
                 "reasoning": "--reasoning"}
_DURATION = re.compile(r"^-?\d+(\.\d+)?(ns|us|µs|ms|s|m|h)?$")


# drafter choices that mean the same for every model, so a router can hand them to each runner
_ANY_MODEL_DRAFTS = (None, "lookup", "none", "auto", "self")


def wanted(engine_config: Any, router: bool, models_preset: Path | None) -> bool:
    """Router mode unless a model is named: `localspec serve` alone serves every model this machine knows (as
    llama-server's router and Ollama do). --model/--pair, or a --draft model (a drafter for the default target),
    keep the single-model server."""
    if engine_config.model is not None:
        if router or models_preset:
            raise click.UsageError("router mode serves every known model: drop --model/--pair (use "
                                   "--default-model NAME for requests that name none)")
        return False
    if router or models_preset is not None or engine_config.models_dirs:
        return True
    return engine_config.draft in _ANY_MODEL_DRAFTS


def keep_alive_seconds(text: str) -> float:
    """--keep-alive / OLLAMA_KEEP_ALIVE ("5m", "30s", "0", "-1") in seconds; negative = keep forever."""
    from ..router.choice import parse_keep_alive

    if not _DURATION.match(text.strip()):
        raise click.BadParameter(f"{text!r}: give a duration such as 5m, 30s, 0 or -1", param_hint="--keep-alive")
    seconds = parse_keep_alive(text)
    return 300.0 if seconds is None else seconds


def serve_args(ctx: click.Context) -> tuple[str, ...]:
    """serve's per-request options the user gave (not their defaults), as each runner's flags."""
    out: list[str] = []
    for name, flag in _SERVE_PASSED.items():
        value = ctx.params.get(name)
        if value is None or ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT:
            continue
        out += [flag, str(value)]
    if ctx.params.get("context_shift"):
        out.append("--context-shift")
    return tuple(out)


def with_alias(specs: dict[str, Any]) -> dict[str, Any]:
    """Each spec's runner args plus `--alias NAME`, so the runner answers to the router's name (Ollama's routes
    check it; every answer reports it)."""
    return {n: replace(s, args=(*s.args, "--alias", n)) for n, s in specs.items()}


def run_router(ctx: click.Context, engine_config: Any, socks: list[socket.socket], urls: str, *,
               api_key: str | None, cors_origins: str, models_max: int, sleep_idle_s: float | None,
               keep_alive: str, presets: Path | None, default_model: str | None, autoload: bool = True) -> None:
    """Discover the models, build the pool and the app, serve until interrupted (the pool stops every runner)."""
    import uvicorn

    from ..models.registry import load_registry
    from ..router.app import create_router_app
    from ..router.choice import RouterConfig
    from ..router.discover import discover
    from ..router.pool import Pool
    from ..server.limits import uvicorn_config

    def specs() -> dict[str, Any]:
        return with_alias(discover(engine_config, presets))

    found = specs()
    if default_model and default_model not in found:
        raise click.BadParameter(f"{default_model!r} is not a known model; known: {', '.join(found) or 'none'}",
                                 param_hint="--default-model")
    fallback = load_registry().default
    config = RouterConfig(api_key=api_key, cors_origins=cors_origins, default_model=default_model,
                          fallback_model=fallback if fallback in found else None, models_max=models_max,
                          sleep_idle_s=sleep_idle_s, keep_alive_s=keep_alive_seconds(keep_alive), autoload=autoload)
    pool = Pool(found, models_max=models_max, sleep_idle_s=sleep_idle_s, default_keep_alive=config.keep_alive_s,
                log=log_err, server_args=serve_args(ctx))
    app = create_router_app(pool, config, lambda: pool.update(specs()))

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            pool.stopping()  # the runners end their answers while uvicorn's grace lets the router relay them
            super().handle_exit(sig, frame)

    server = Server(uvicorn_config(app, log_level="warning", timeout_graceful_shutdown=2, access_log=False))
    names = ", ".join(found) or "none yet"
    log_err(f"localspec serve: {urls} (router, {len(found)} models: {names}; at most {models_max} loaded)")
    server.run(sockets=socks)
