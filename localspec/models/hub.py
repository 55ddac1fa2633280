"""Hugging Face hub models: pick GGUF files by quant tag, pull them into the hub cache, find them offline.

The cache is huggingface-hub's, read and written through its public API only: `scan_cache_dir` lists what a
revision holds, `try_to_load_from_cache` finds one file, `hf_hub_download` places files and writes the ref, its
`dry_run` names where a file goes. Finding a pulled file never opens a socket, so `run`, `chat` and `serve` work
offline; HF_HUB_OFFLINE is the client's own switch (`is_offline_mode`, read when it is imported).

One thing the client does not do: since 1.x it deletes its partial file when a download fails, and a GGUF is
gigabytes. So a pull fetches the bytes itself (download.py: into `<hub cache>/.localspec-downloads/<etag>
.localspec.part`, resumed, checked against the etag), and only then moves the file to the place
`hf_hub_download(dry_run=True)` names. Xet-stored files go to `hf_hub_download` whole (hf_xet keeps its chunks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import HubError
from .download import Log, Progress, fetch, is_transport_error, verify_blob

if TYPE_CHECKING:
    from huggingface_hub import CachedFileInfo, CachedRevisionInfo


DEFAULT_QUANT = "Q4_K_M"
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(:[\w.]+)?")


@dataclass(frozen=True)
class HubRef:
    """A GGUF in a hub repo: an exact `file`, or a `quant` tag matched against the repo's file names."""

    repo: str
    file: str | None = None
    quant: str | None = None
    revision: str = "main"


def looks_like_hub_id(spec: str) -> bool:
    return _HUB_ID.fullmatch(spec) is not None and not spec.endswith(".gguf")


def parse_hub_spec(spec: str) -> HubRef:
    """'owner/repo' or 'owner/repo:Q4_K_M' -> HubRef."""
    repo, _, quant = spec.partition(":")
    return HubRef(repo, quant=quant or None)


# -- choosing files (pure) ------------------------------------------------------------------------------------

def quant_of(filename: str) -> str | None:
    """'Llama-3.2-1B-Instruct-Q4_K_M.gguf' -> 'Q4_K_M' (the last quant-looking tag in the name)."""
    stem = _SHARD.sub(".gguf", Path(filename).name)[: -len(".gguf")]
    tags = re.findall(r"(?i)(?<![A-Za-z0-9])((?:IQ|Q)\d[A-Z0-9_]*|BF16|F16|F32)(?![A-Za-z0-9])", stem)
    return tags[-1].upper().rstrip("_") if tags else None


def select_files(names: list[str], ref: HubRef) -> list[str]:
    """The files `ref` means among a repo's `names`: the exact file, or every shard of the one quant."""
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if ref.file:
        if ref.file not in names:
            raise HubError(f"{ref.repo} has no file {ref.file}; GGUF files there: {', '.join(ggufs) or 'none'}")
        chosen = [ref.file]
    else:
        ggufs_no_mmproj = [n for n in ggufs if "mmproj" not in n.lower()]
        if ref.quant:
            chosen = [n for n in ggufs_no_mmproj if (quant_of(n) or "").upper() == ref.quant.upper()]
        elif len(ggufs_no_mmproj) == 1 or len({_SHARD.sub("", n) for n in ggufs_no_mmproj}) == 1:
            chosen = ggufs_no_mmproj
        else:
            chosen = [n for n in ggufs_no_mmproj if quant_of(n) == DEFAULT_QUANT]
        if not chosen:
            quants = sorted({q for n in ggufs_no_mmproj if (q := quant_of(n))})
            want = ref.quant or "a single GGUF"
            raise HubError(f"{ref.repo} has no {want} file; quants there: {', '.join(quants) or 'none'} "
                           f"(pull {ref.repo}:QUANT)")
    first = chosen[0]
    m = _SHARD.search(first)
    if m:  # every shard of that file, which llama.cpp loads from the first
        base = first[: m.start()]
        chosen = sorted(n for n in names if n.startswith(base) and (s := _SHARD.search(n)) and s.group(2) == m.group(2))
        if len(chosen) != int(m.group(2)):
            raise HubError(f"{ref.repo}: {first} has {int(m.group(2))} shards but {len(chosen)} are listed")
    elif len(chosen) > 1:
        raise HubError(f"{ref.repo}: {ref.quant} matches several files ({', '.join(chosen)}); "
                       "name one with file = \"...\" in models.toml")
    return chosen


# -- settings -------------------------------------------------------------------------------------------------

def is_offline() -> bool:
    """The client's offline switch, so that we refuse exactly when its own session would."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode()


def endpoint() -> str:
    """HF_ENDPOINT as set now (it is passed to every call), else the client's default."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def cache_dir() -> str:
    """HF_HUB_CACHE as set now (it is passed to every call), else the client's default."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


# -- the cache (no network) -----------------------------------------------------------------------------------

def _revisions(repo: str) -> list[CachedRevisionInfo]:
    """The client's records (CachedRevisionInfo) of every cached revision of model repo `repo`."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir(cache_dir()).repos
    except CacheNotFound:
        return []
    return [v for r in repos if r.repo_id == repo and r.repo_type == "model" for v in r.revisions]


def _files(rev: CachedRevisionInfo) -> dict[str, CachedFileInfo]:
    """Relative file name -> CachedFileInfo for one cached revision."""
    return {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}


def _cached(repo: str, revision: str) -> dict[str, CachedFileInfo]:
    """Relative file name -> CachedFileInfo for every file of `repo` at a branch, tag or commit."""
    rev = next((v for v in _revisions(repo) if revision in v.refs or v.commit_hash == revision), None)
    return _files(rev) if rev is not None else {}


def cached_files(repo: str, revision: str = "main") -> list[str]:
    return sorted(_cached(repo, revision))


def cached_path(ref: HubRef) -> Path | None:
    """The first (or only) file of `ref` in the hub cache, or None; reads only the disk."""
    from huggingface_hub import try_to_load_from_cache

    if ref.file and not _SHARD.search(ref.file):  # one file, not a shard set: no need to list the cache
        found = try_to_load_from_cache(ref.repo, ref.file, cache_dir=cache_dir(), revision=ref.revision)
        return Path(found) if isinstance(found, str) else None
    files = _cached(ref.repo, ref.revision)
    try:
        chosen = select_files(list(files), ref)
    except HubError:
        return None
    return files[chosen[0]].file_path


# -- pulling --------------------------------------------------------------------------------------------------

def list_repo_files(repo: str, revision: str = "main") -> list[str]:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint()).list_repo_files(repo, revision=revision)


def _reuse(repo: str, filename: str, etag: str, size: int | None, dst: Path, log: Log) -> bool:
    """Link the same file from another cached revision (a repo whose README changed) instead of fetching it."""
    same = [f for rev in _revisions(repo) if (f := _files(rev).get(filename)) and f.size_on_disk == size]
    for f in same:
        try:
            kind = verify_blob(f.blob_path, etag)
        except HubError:
            continue
        log(f"localspec: {filename}: the same file is cached for another revision ({kind} verified); linked")
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f.blob_path, dst)
        except OSError:
            shutil.copyfile(f.blob_path, dst)
        return True
    return False


def _download(repo: str, filename: str, revision: str, log: Log, progress: Progress | None = None) -> Path:
    """One file into the hub cache; returns its path there (the client's own, with the revision's ref)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    ep, cache = endpoint(), cache_dir()
    meta = get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision, endpoint=ep), endpoint=ep)
    if meta.etag is None or meta.commit_hash is None:
        raise HubError(f"{repo}: the hub sent no etag or commit for {filename}; check HF_ENDPOINT")
    cached = try_to_load_from_cache(repo, filename, cache_dir=cache, revision=meta.commit_hash)
    if not isinstance(cached, str) and meta.xet_file_data is None:
        dst = Path(hf_hub_download(repo, filename, revision=revision, cache_dir=cache, endpoint=ep,
                                   dry_run=True).local_path)
        if not _reuse(repo, filename, meta.etag, meta.size, dst, log):
            part = fetch(meta.location, meta.etag, meta.size, filename, log, cache=cache, hub=ep,
                         progress=progress)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(part, dst)
            with contextlib.suppress(OSError):
                part.parent.rmdir()  # only when no other partial download waits there
    path = Path(hf_hub_download(repo, filename, revision=revision, cache_dir=cache, endpoint=ep))
    if progress is not None:  # whole: already cached, linked from another revision, or fetched by hf_xet
        size = path.stat().st_size
        progress(filename, meta.etag, size, size)
    return path


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def unreachable() -> str | None:
    """Why the endpoint cannot be reached (one TCP connect, 5 s), or None. Skipped behind a proxy, where only
    the proxy knows. Saves the client's five silent retries (~25 s) when there is no network at all."""
    import socket

    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    u = urlsplit(endpoint())
    try:
        socket.create_connection((u.hostname or "", u.port or (443 if u.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        return e.strerror or str(e)
    return None


@contextmanager
def hub_logs(verbose: bool):
    """huggingface-hub's retry warnings only with --verbose: a failed pull is one line from us."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def pull(ref: HubRef, *, log: Log = print, verbose: bool = False, progress: Progress | None = None) -> Path:
    """Download every file `ref` needs (all shards) into the hub cache; returns the first file's path.
    `progress` hears of each file's bytes as they arrive (the router's /api/pull streams them)."""
    if is_offline():
        raise HubError(f"offline (HF_HUB_OFFLINE is set): cannot pull {ref.repo}; unset it and retry")
    why = unreachable()
    if why:
        raise HubError(f"cannot reach {endpoint()} ({why}): no network? check it or HF_ENDPOINT, then run the "
                       "pull again (it resumes)")
    with hub_logs(verbose):
        return _pull(ref, log, progress)


def _pull(ref: HubRef, log: Log, progress: Progress | None = None) -> Path:
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        names = list_repo_files(ref.repo, ref.revision)
        chosen = select_files(names, ref)
        paths = [_download(ref.repo, name, ref.revision, log, progress) for name in chosen]
    except RepositoryNotFoundError:
        raise HubError(f"repository {ref.repo} not found on {endpoint()} (private or gated repos need "
                       "'hf auth login')") from None
    except HfHubHTTPError as e:
        raise HubError(f"{ref.repo}: {str(e).splitlines()[0]}; run the pull again (it resumes)") from None
    except OSError as e:
        raise HubError(f"{ref.repo}: download failed ({e}); run the pull again to resume") from None
    except Exception as e:
        if not is_transport_error(e):
            raise
        raise HubError(f"cannot reach {endpoint()} ({e}); check the network or HF_ENDPOINT, then run the pull "
                       "again (it resumes)") from None
    return paths[0]


def remove(ref: HubRef) -> list[Path]:
    """Delete the cached files of `ref` and their blobs (a blob another cached file still uses stays)."""
    files = _cached(ref.repo, ref.revision)
    try:
        chosen = select_files(list(files), ref)
    except HubError:
        return []
    gone = [files[name] for name in chosen]
    kept = {f.blob_path for rev in _revisions(ref.repo) for f in rev.files} - {f.blob_path for f in gone}
    for f in gone:
        f.file_path.unlink()
        if f.blob_path != f.file_path and f.blob_path not in kept:
            f.blob_path.unlink(missing_ok=True)
    return [f.file_path for f in gone]
