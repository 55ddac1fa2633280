"""The router's own routes: what llama-server's router mode and Ollama answer about models, not a model's text.

llama-server: GET /models (= /v1/models, every model with its `status`), POST /models/load and /models/unload
({"model": name}, answered {"success": true} at once: the state moves in /models), POST /models (a download into
the hub cache, in the background: the model is listed once it is there), DELETE /models?model=NAME (a hub-cache
model only, as /api/delete), GET /props (`role: router`, llama.cpp's `build_info`; ?model=X is that model's
runner's own /props), GET /health. Ollama: GET /api/tags (every model), /api/ps (the
loaded ones, with `expires_at`), /api/version, POST /api/pull (NDJSON progress into the hub cache: pulls.py),
DELETE /api/delete (a hub-cache model only: the router deletes no file it did not pull).
"""

from __future__ import annotations

import asyncio
import functools
import logging
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
log = logging.getLogger("localspec.router")


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
            return JSONResponse(router_props(config, await asyncio.to_thread(llama_build)))
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

    @r.post("/models")
    async def download(request: Request) -> Response:
        """llama-server's download: refused at once for a name that is no hub model or is listed already;
        otherwise {"success": true} while the pull runs, and GET /models lists the model when it is in."""
        body = await request.json()
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError("model must be a non-empty string")
        if name in pool.known():
            raise ValueError(f"model '{name}' already exists")
        if pulls.hub_ref(name) is None:
            raise ValueError(f"model validation failed, unable to download '{name}' (not owner/repo[:QUANT] "
                             "or a models.toml name)")
        task = asyncio.ensure_future(_downloaded(name, rediscover))
        loads.add(task)
        task.add_done_callback(loads.discard)
        return JSONResponse({"success": True})

    @r.delete("/models")
    async def remove(model: str = "") -> Response:
        if not model:
            raise ValueError("model must be a non-empty string: DELETE /models?model=NAME")
        refused = await _delete(pool, str(pool.resolve(model)), rediscover, "/models")
        return refused or JSONResponse({"success": True})


async def _downloaded(name: str, rediscover: Callable[[], None]) -> None:
    """A background pull for POST /models; a failure is logged (llama-server reports it on /models/sse)."""
    async for event in pulls.pull_events(name, on_pulled=rediscover):
        if "error" in event:
            log.warning("download of %s failed: %s", name, event["error"])


async def _delete(pool: Any, name: str, rediscover: Callable[[], None], path: str) -> Response | None:
    """Unload `name` and remove its files from the hub cache; a 400 when it is not a pulled model."""
    await pool.unload(name)
    if await asyncio.to_thread(pulls.delete_pulled, name) is None:
        return error_body(path, 400, f"model '{name}' is not one localspec pulled into the hub cache; "
                          "the router deletes only what it pulled (remove the file yourself)")
    rediscover()
    return None


@functools.cache
def llama_build() -> str:
    """llama.cpp's build as llama-server's router reports it (`b<build>-<commit>`), read once: the first
    /props loads libllama into the router (about 19 MB more resident; runners load it anyway)."""
    from ..backend import llama_build as build

    return build()


async def _runner_get(pool: Any, client: Client, model: str) -> Response:
    """A GET answered by the model's own runner (started if need be)."""
    runner = await pool.acquire(model, None)
    return Relayed(client, runner, model, lambda: pool.release(runner, None))


def router_props(config: Any, build: str) -> dict[str, Any]:
    """llama-server's router /props: who answers (`role`), how many models may be loaded at once, and the
    llama.cpp `build` the runners use."""
    return {"role": "router", "max_instances": config.models_max, "models_autoload": config.autoload,
             "model_alias": "localspec", "model_path": "none",
             "default_generation_settings": {"params": {}, "n_ctx": 0},
             "build_info": build, "localspec_version": __version__, "sleep_idle_seconds": config.sleep_idle_s}


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
        refused = await _delete(pool, await _named(pool, request), rediscover, "/api/delete")
        return refused or Response(status_code=200)


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
