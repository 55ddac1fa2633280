"""The router's own routes: what llama-server's router mode and Ollama answer about models, not a model's text.

llama-server: GET /models (= /v1/models, every model with its `status`), POST /models/load and /models/unload
({"model": name}, answered {"success": true} at once: the state moves in /models), GET /props (`role: router`;
?model=X is that model's runner's own /props), GET /health. Ollama: GET /api/tags (every model), /api/ps (the
loaded ones, with `expires_at`), /api/version, POST /api/pull (NDJSON progress into the hub cache: pulls.py),
DELETE /api/delete (a hub-cache model only: the router deletes no file it did not pull).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from .. import __version__
from ..server.http import error_body
from . import pulls
from .choice import choose_model
from .proxy import Client, Relayed

OWNER = "localspec"


def _iso(t: float | None) -> str:
    """Ollama's time stamps; a model kept forever expires in the far future, as Ollama reports it."""
    if t is None or t == float("inf"):
        return "2318-01-01T00:00:00Z"
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _path(pool: Any, name: str) -> Path | None:
    spec = pool.specs.get(name)
    return Path(spec.path) if spec is not None else None


def tag_entry(name: str, path: Path | None) -> dict[str, Any]:
    """One model as Ollama's /api/tags lists it, from the file alone (its header: arch, quant)."""
    from ..models.model_facts import quick_facts

    try:
        st = path.stat() if path else None
        facts = quick_facts(path) if path else {}
    except (OSError, ValueError):
        st, facts = None, {}
    arch = facts.get("arch", "")
    size = st.st_size if st else 0
    mtime = st.st_mtime if st else 0.0
    return {"name": name, "model": name, "modified_at": _iso(mtime), "size": size,
            "digest": f"{size:x}{int(mtime):x}".rjust(64, "0"),
            "details": {"format": "gguf", "family": arch, "families": [arch] if arch else [],
                        "parameter_size": "", "quantization_level": facts.get("quant") or "", "parent_model": ""}}


def model_entry(s: Any, created: int) -> dict[str, Any]:
    """One model as llama-server's router lists it in /models: OpenAI's fields plus `status`."""
    status: dict[str, Any] = {"value": s.state}
    if s.pid:
        status |= {"pid": s.pid, "port": s.port}
    if s.failure:
        status["failure"] = s.failure
    return {"id": s.name, "object": "model", "owned_by": OWNER, "created": created, "status": status,
            "meta": {"size": s.size_bytes, "ram_estimate": s.ram_estimate, "vram_estimate": s.vram_estimate,
                     "source": s.source, "path": s.path, "busy": s.busy}}


def router(pool: Any, config: Any, client: Client, rediscover: Callable[[], None] | None = None) -> APIRouter:
    r = APIRouter(tags=["router"])

    @r.get("/health")
    @r.get("/v1/health", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @r.get("/props")
    async def props(request: Request, model: str | None = None) -> Response:
        """The router's own props; ?model=X: that model's runner's, or, when it is not running, its state
        (`is_sleeping` as llama-server reports it): reading props never wakes a model."""
        if model is None:
            return JSONResponse(router_props(config))
        name = pool.resolve(model)
        state = pool.state(name)
        if state != "loaded":
            return JSONResponse({"model": name, "model_alias": name, "role": "model", "status": state,
                                 "is_sleeping": state == "sleeping"})
        return await _runner_get(pool, client, name)

    @r.get("/metrics")
    async def metrics(request: Request, model: str | None = None) -> Response:
        """A runner's Prometheus metrics: ?model=X, else the model a request naming none would go to; a model
        that is not running has none to give (a scrape never loads or wakes it)."""
        name = choose_model(pool, config, model)
        if pool.state(name) != "loaded":
            return PlainTextResponse(f"# model {name} is {pool.state(name)}: no runner, no metrics\n")
        return await _runner_get(pool, client, name)

    _model_routes(r, pool, rediscover or (lambda: None))
    _ollama_routes(r, pool, rediscover or (lambda: None))
    return r


def _model_routes(r: APIRouter, pool: Any, rediscover: Callable[[], None]) -> None:
    """llama-server's router: the model list with each one's status (`?reload=1` reads the presets file, the
    models dirs and the hub cache again first), load and unload by name."""
    started = int(time.time())
    loads: set[asyncio.Task] = set()  # background loads, held until done (the loop keeps only weak references)

    @r.get("/models")
    @r.get("/v1/models")
    async def models(reload: str | None = None) -> dict[str, Any]:
        if reload:
            rediscover()
        return {"object": "list", "data": [model_entry(s, started) for s in pool.status()]}

    @r.post("/models/load")
    async def load(request: Request) -> Response:
        name = await _named(pool, request)
        task = asyncio.ensure_future(_quietly(pool.load(name)))  # its state shows in /models
        loads.add(task)
        task.add_done_callback(loads.discard)
        return JSONResponse({"success": True})

    @r.post("/models/unload")
    async def unload(request: Request) -> Response:
        await pool.unload(await _named(pool, request))
        return JSONResponse({"success": True})


async def _runner_get(pool: Any, client: Client, model: str) -> Response:
    """A GET answered by the model's own runner (started if need be)."""
    runner = await pool.acquire(model, None)
    return Relayed(client, runner, model, lambda: pool.release(runner, None))


def router_props(config: Any) -> dict[str, Any]:
    """llama-server's router /props: who answers (`role`), how many models may be loaded at once."""
    return {"role": "router", "max_instances": config.models_max, "models_autoload": config.autoload,
             "model_alias": "localspec", "model_path": "none",
             "default_generation_settings": {"params": {}, "n_ctx": 0},
             "build_info": f"localspec {__version__}", "sleep_idle_seconds": config.sleep_idle_s}


def _ollama_routes(r: APIRouter, pool: Any, rediscover: Callable[[], None]) -> None:
    @r.get("/api/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @r.get("/api/tags")
    async def tags() -> dict[str, Any]:
        return {"models": [tag_entry(n, _path(pool, n)) for n in pool.known()]}

    @r.get("/api/ps")
    async def ps() -> dict[str, Any]:
        running = [s for s in pool.status() if s.state == "loaded"]
        return {"models": [tag_entry(s.name, _path(pool, s.name)) | {
            "expires_at": _iso(s.expires_at), "size_vram": 0} for s in running]}

    @r.post("/api/pull")
    async def pull(request: Request) -> Response:
        body = await request.json()
        name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            return error_body("/api/pull", 400, "pull needs a model name: {\"model\": NAME}")
        stream = bool(body.get("stream", True))
        events = pulls.pull_events(name, on_pulled=rediscover)
        if stream:
            return StreamingResponse(pulls.ndjson(events), media_type="application/x-ndjson")
        return JSONResponse(*await pulls.last(events))

    @r.delete("/api/delete")
    async def delete(request: Request) -> Response:
        name = await _named(pool, request)
        await pool.unload(name)
        gone = await asyncio.to_thread(pulls.delete_pulled, name)
        if gone is None:
            return error_body("/api/delete", 400, f"model '{name}' is not one localspec pulled into the hub cache; "
                              "the router deletes only what it pulled (remove the file yourself)")
        rediscover()
        return Response(status_code=200)


async def _named(pool: Any, request: Request) -> str:
    """The known model a management request names ({"model": name}; Ollama's older {"name": name})."""
    body = await request.json()
    name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("name the model: {\"model\": NAME}")
    return str(pool.resolve(name))


async def _quietly(coro: Any) -> None:
    """A background load whose failure the model's status reports ("failed"), not a lost task's traceback."""
    try:
        await coro
    except Exception:  # noqa: BLE001 - the pool records the failure in the model's status
        pass
