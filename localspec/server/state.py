"""The server's state: `ServerConfig` (the serve options) and `State` (the engine, the worker, the metrics, the
names the model answers to, the token budget rule).

Route handlers live at module level and reach the one State through `StateDep` (FastAPI's dependency on
`request.app.state.localspec`, set by app.py), so no handler is a closure over a router's arguments.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ..engine.engine import Engine
from .execution.metrics import Metrics
from .execution.worker import Worker
from .http import ApiError


@dataclass(frozen=True)
class ServerConfig:
    api_key: str | None = None
    spec_max_queue: int = 4  # more waiting jobs than this -> plain decoding for the job that starts
    max_predict: int | None = None  # cap on generated tokens per request (None = the context)
    alias: str | None = None  # the model name every response, /v1/models and /api/tags report
    cors_origins: str = "localhost"  # "localhost" (reflect local origins, llama-server's rule), "*", or a list
    aliases: tuple[str, ...] = ()  # more names the model answers to (llama-server's comma-separated --alias)
    tags: tuple[str, ...] = ()  # llama-server's --tags: informational, listed in /v1/models
    n_predict: int | None = None  # llama-server's -n: tokens a request generates when it does not say
    context_shift: bool = False  # llama-server's --context-shift: off by default, as there
    reasoning_format: str = "auto"  # llama-server's --reasoning-format: where <think> text goes (engine/reasoning.py)
    hold_heads: bool = False  # a runner behind the router: each answer's head waits for its first piece (http.py)
    slots: bool = True  # llama-server's GET /slots (--no-slots: a 501, as there)


class State:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = Metrics()
        self.worker = Worker(engine, spec_max_queue=config.spec_max_queue, on_finish=self.metrics.job_done)
        self.started_at = time.time()
        p = engine.target.path
        self.model_names = {n for n in (engine.name, p.name, p.stem, config.alias, *config.aliases) if n}

    @property
    def n_ctx(self) -> int:
        return self.engine.target.n_ctx

    @property
    def model_name(self) -> str:
        """The name clients see: the first --alias in alphabetical order (llama-server keeps them in a sorted
        set), else the served model's."""
        return self.config.alias or min(self.config.aliases, default="") or self.engine.name

    @property
    def aliases(self) -> list[str]:
        """Every --alias, the reported name first (llama-server's `aliases`)."""
        names = [n for n in (self.model_name, self.config.alias, *self.config.aliases) if n]
        return list(dict.fromkeys(names)) or [self.engine.name]

    def check_model(self, name: str | None) -> None:
        """Ollama's routes only (its clients expect a 404 for a model that is not there; /v1/* and the
        llama.cpp routes serve the loaded model whatever the name, as llama-server and LM Studio do).
        Empty means the served model; Ollama's ':latest' tag is accepted."""
        if not name:
            return
        if name in self.model_names or name.removesuffix(":latest") in self.model_names:
            return
        raise ApiError(404, f"model '{name}' not found; this server serves '{self.model_name}' "
                            "(GET /api/tags lists it)", "not_found_error")

    def budget(self, requested: int | None, name: str = "n_predict") -> int:
        """Tokens to generate: None/-1 (or more than the context holds) = until EOS or a full context,
        which ends with finish_reason "length" as in llama-server; capped by --max-predict."""
        if requested is not None and requested < -2:
            raise ApiError(400, f"{name} must be >= -1 (-1 = until the context is full), got {requested}")
        if requested is None:  # llama-server's -n is the default, not a cap
            requested = self.config.n_predict
        over = requested is not None and requested > self.n_ctx and not self.config.context_shift
        n = self.n_ctx if requested is None or requested < 0 or over else requested  # a shift makes room
        cap = self.config.max_predict
        return min(n, cap) if cap else n


def get_state(request: Request) -> State:
    """The app's one State (app.py puts it on `app.state.localspec`)."""
    return request.app.state.localspec


StateDep = Annotated[State, Depends(get_state)]  # a handler's `state: StateDep` parameter
