"""Ollama's /api/pull and /api/delete over localspec's hub cache (models/hub.py).

A pull names a models.toml entry or a hub repo `owner/repo[:QUANT]`; its progress is Ollama's NDJSON:
{"status": "pulling manifest"}, then {"status": "pulling <digest>", "digest", "total", "completed"} as each
file's bytes arrive (every PROGRESS_EVERY_S, and at each file's end), {"status": "verifying sha256 digest"},
{"status": "writing manifest"}, {"status": "success"}, or a last {"error": ...}. A file already in the cache
is not fetched again (so a pull works offline for what is there): the download itself is hub.pull's,
resumable and checked, run in a thread. A caller that hangs up leaves the download to finish (a later pull
finds the file).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..errors import LocalspecError
from ..models import hub

_SHA256 = re.compile(r"[0-9a-f]{64}")
PROGRESS_EVERY_S = 0.25  # how often a file's byte count is streamed (Ollama's bars redraw about as often)


def hub_ref(name: str) -> hub.HubRef | None:
    """The hub file(s) `name` stands for: a registry entry's, or a hub id's; None for anything else."""
    from ..models.registry import load_registry

    entry = load_registry().models.get(name)
    if entry is not None:
        return hub.HubRef(entry.hf, file=entry.file, quant=entry.quant, revision=entry.revision) if entry.hf else None
    return hub.parse_hub_spec(name) if hub.looks_like_hub_id(name) else None


def _fetch(name: str, progress: hub.Progress | None = None) -> Path:
    """The file `name` names, downloaded when it is not cached (registry package entries: their own way)."""
    from ..models.registry import load_registry
    from ..models.resolve import entry_path

    ref = hub_ref(name)
    if ref is not None:
        return hub.cached_path(ref) or hub.pull(ref, log=lambda _line: None, progress=progress)
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


def _transfer(file: str, etag: str, completed: int, total: int | None) -> dict[str, Any]:
    """One progress line: the digest an LFS file's etag is (its sha256), else one made from its name."""
    sha = etag.strip('"').lower()
    if not _SHA256.fullmatch(sha):
        sha = hashlib.sha256(f"{file}:{etag}".encode()).hexdigest()
    return {"status": f"pulling {sha[:12]}", "digest": f"sha256:{sha}", "total": total or completed,
            "completed": completed}


async def _fetched(name: str, lines: asyncio.Queue) -> Path:
    """_fetch in a thread, its progress put on `lines` (one a file per PROGRESS_EVERY_S, and each file's last)."""
    loop = asyncio.get_running_loop()
    last: dict[str, float] = {}  # each file's last line, time.monotonic()

    def progress(file: str, etag: str, completed: int, total: int | None) -> None:
        now = time.monotonic()
        if completed == total or now - last.get(file, 0.0) >= PROGRESS_EVERY_S:
            last[file] = now
            loop.call_soon_threadsafe(lines.put_nowait, _transfer(file, etag, completed, total))

    return await asyncio.to_thread(_fetch, name, progress)


async def _as_they_come(job: asyncio.Future, lines: asyncio.Queue) -> AsyncIterator[dict[str, Any]]:
    """The progress lines while `job` runs, then those left (the thread puts each before it returns)."""
    while not job.done():
        line = asyncio.ensure_future(lines.get())
        try:
            await asyncio.wait({job, line}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            line.cancel()
        if line.done() and not line.cancelled():
            yield line.result()
    while not lines.empty():
        yield lines.get_nowait()


async def pull_events(name: str, on_pulled: Callable[[], None]) -> AsyncIterator[dict[str, Any]]:
    """Ollama's pull progress for `name`; `on_pulled` runs once the file is in place (the router re-lists)."""
    yield {"status": "pulling manifest"}
    lines: asyncio.Queue = asyncio.Queue()
    job = asyncio.ensure_future(_fetched(name, lines))
    job.add_done_callback(lambda j: j.cancelled() or j.exception())  # a caller gone: its error is not "unretrieved"
    async for line in _as_they_come(job, lines):
        yield line
    try:
        path = job.result()
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
