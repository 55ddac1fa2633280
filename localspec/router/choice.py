"""What a forwarded request asks of the router: which model it is for, how long that model stays loaded after it
(Ollama's keep_alive), and whether it may start the model (llama-server's autoload); with the router's settings
that decide when the request does not say.

A request without a model goes to --default-model, else to the one loaded model, else to the registry's default,
else to the first known one (llama.vim sends no model to /infill).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl

from .refusals import UnknownModel

FOREVER = -1.0  # Ollama: a negative keep_alive keeps the model loaded


@dataclass(frozen=True)
class RouterConfig:
    """The router's own settings (a runner's come through its command line)."""

    api_key: str | None = None
    cors_origins: str = "localhost"
    default_model: str | None = None  # --default-model: for requests that name no model
    fallback_model: str | None = None  # the registry's default, when no model is named and several are loaded
    models_max: int = 4
    sleep_idle_s: float | None = None
    keep_alive_s: float = 300.0  # Ollama's default (OLLAMA_KEEP_ALIVE=5m)
    autoload: bool = True  # llama-server's --models-autoload: a request may start its model's runner


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's keep_alive: a number of seconds or a Go duration ("5m", "1h30m", "-1m"); negative = forever,
    0 = unload after the request; None (absent) = the router's default. Raises ValueError for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be a duration or a number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        return FOREVER if value < 0 else float(value)
    text = str(value).strip()
    sign, text = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"keep_alive: cannot read {value!r} as a duration (e.g. \"5m\", \"30s\", 0, -1)") from None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    return FOREVER if sign < 0 and seconds > 0 else seconds


def requested_model(body: dict[str, Any]) -> str | None:
    """The model a request's body names: `model`, or `name` (Ollama's /api/show)."""
    name = body.get("model") or body.get("name")
    return name if isinstance(name, str) and name else None


def choose_model(pool: Any, config: RouterConfig, name: str | None) -> str:
    """The model a request is for: its own name (the pool resolves Ollama's ':latest' and aliases), else
    --default-model, else the one loaded model, else the registry's default, else the first known.
    Raises UnknownModel, which lists the known ones."""
    if name is not None:
        return str(pool.resolve(name))
    if config.default_model:
        return str(pool.resolve(config.default_model))
    loaded = pool.loaded()
    if len(loaded) == 1:
        return str(loaded[0])
    known = pool.known()
    if config.fallback_model in known:
        return str(config.fallback_model)
    if not known:
        raise UnknownModel("(none given)", known)
    return str(known[0])


def autoload(scope: dict, config: RouterConfig) -> bool:
    """Whether this request may start its model: `?autoload=true|1|false` (llama-server's), else the router's
    --models-autoload."""
    query = dict(parse_qsl((scope.get("query_string") or b"").decode("latin-1")))
    if "autoload" not in query:
        return config.autoload
    return query["autoload"] in ("true", "1")


def is_load_request(path: str, body: dict[str, Any]) -> bool:
    """Ollama's load (or, with keep_alive 0, unload) request: /api/generate or /api/chat with nothing to say."""
    if path == "/api/generate":
        return not body.get("prompt") and not body.get("suffix")
    return path == "/api/chat" and not body.get("messages")


def unload_answer(path: str, name: str) -> dict[str, Any]:
    """What Ollama answers an unload request: done, done_reason "unload", nothing generated."""
    now = datetime.now(timezone.utc).isoformat()
    said = {"message": {"role": "assistant", "content": ""}} if path == "/api/chat" else {"response": ""}
    return {"model": name, "created_at": now, **said, "done": True, "done_reason": "unload"}
