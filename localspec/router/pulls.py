"""Ollama's /api/pull and /api/delete over localspec's hub cache (models/hub.py).

A pull names a models.toml entry or a hub repo `owner/repo[:QUANT]`; its progress is Ollama's NDJSON:
{"status": "pulling manifest"}, one {"status": "downloading", "digest", "total", "completed"} per file,
{"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}, or a last
{"error": ...}. A file already in the cache is not fetched again (so a pull works offline for what is there):
the download itself is hub.pull's, resumable and checked, run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..errors import LocalspecError
from ..models import hub

_SHA256 = re.compile(r"[0-9a-f]{64}")


def hub_ref(name: str) -> hub.HubRef | None:
    """The hub file(s) `name` stands for: a registry entry's, or a hub id's; None for anything else."""
    from ..models.registry import load_registry

    entry = load_registry().models.get(name)
    if entry is not None:
        return hub.HubRef(entry.hf, file=entry.file, quant=entry.quant, revision=entry.revision) if entry.hf else None
    return hub.parse_hub_spec(name) if hub.looks_like_hub_id(name) else None


def _fetch(name: str) -> Path:
    """The file `name` names, downloaded when it is not cached (registry package entries: their own way)."""
    from ..models.registry import load_registry
    from ..models.resolve import entry_path

    ref = hub_ref(name)
    if ref is not None:
        return hub.cached_path(ref) or hub.pull(ref, log=lambda _line: None)
    entry = load_registry().models.get(name)
    if entry is None:
        raise LocalspecError(f"pull model manifest: '{name}' is neither a models.toml name nor a hub repo "
                             "owner/repo[:QUANT]")
    return entry_path(entry, fetch=True, log=lambda _line: None)


def digest(path: Path) -> str:
    """The file's sha256 as the hub cache already knows it (an LFS blob is named by it), else its size+mtime."""
    blob = path.resolve().name
    if _SHA256.fullmatch(blob):
        return f"sha256:{blob}"
    st = path.stat()
    return f"sha256:{st.st_size:x}{int(st.st_mtime):x}".ljust(71, "0")


async def pull_events(name: str, on_pulled: Callable[[], None]) -> AsyncIterator[dict[str, Any]]:
    """Ollama's pull progress for `name`; `on_pulled` runs once the file is in place (the router re-lists)."""
    yield {"status": "pulling manifest"}
    try:
        path = await asyncio.to_thread(_fetch, name)
    except LocalspecError as e:
        yield {"error": str(e)}
        return
    size = path.stat().st_size
    yield {"status": f"pulling {digest(path)[7:19]}", "digest": digest(path), "total": size, "completed": size}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    on_pulled()
    yield {"status": "success"}


async def ndjson(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for e in events:
        yield json.dumps(e).encode() + b"\n"


async def last(events: AsyncIterator[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """A pull with stream=false: Ollama answers the last status alone (500 with the error on failure)."""
    final: dict[str, Any] = {}
    async for e in events:
        final = e
    return final, 500 if "error" in final else 200


def delete_pulled(name: str) -> list[Path] | None:
    """Remove a model's files from the hub cache; None when `name` is not a hub model (nothing deleted)."""
    ref = hub_ref(name)
    if ref is None or hub.cached_path(ref) is None:
        return None
    return hub.remove(ref)
