"""Hugging Face hub models: pick GGUF files by quant tag, pull them into the hub cache, find them offline.

Pulling uses the real huggingface-hub client (HEAD for etag/size/commit, ranged GET, its progress bar) but keeps
the partial download under our own name, `blobs/<etag>.localspec.part`, so an interrupted pull - a dropped
connection or a killed process - resumes where it stopped (huggingface-hub >= 1.x deletes its own partial
files). The finished blob is checked against the hub's sha256 (LFS) or git sha1 before it enters the cache;
then `hf_hub_download` links it into `snapshots/` exactly as if it had downloaded it.

Finding a pulled file reads only the cache (`refs/`, `snapshots/`): it never opens a socket, so `run`, `chat`
and `serve` work offline. Settings are read from the environment at call time (HF_ENDPOINT, HF_HUB_CACHE,
HF_HOME, HF_HUB_OFFLINE), not at import time as huggingface-hub does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import LocalspecError

DEFAULT_QUANT = "Q4_K_M"
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(:[\w.]+)?")


class HubError(LocalspecError):
    """A pull failed: offline, not found, ambiguous quant, or a checksum mismatch."""

    exit_code = 3


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


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def is_offline() -> bool:
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def cache_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface" / "hub"


def storage_folder(repo: str) -> Path:
    return cache_root() / ("models--" + repo.replace("/", "--"))


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
        chosen = sorted(n for n in names if n.startswith(base) and _SHARD.search(n)
                        and _SHARD.search(n).group(2) == m.group(2))
        if len(chosen) != int(m.group(2)):
            raise HubError(f"{ref.repo}: {first} has {int(m.group(2))} shards but {len(chosen)} are listed")
    elif len(chosen) > 1:
        raise HubError(f"{ref.repo}: {ref.quant} matches several files ({', '.join(chosen)}); "
                       "name one with file = \"...\" in models.toml")
    return chosen


# -- the cache (no network) -----------------------------------------------------------------------------------

def cached_commit(repo: str, revision: str = "main") -> str | None:
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    ref = storage_folder(repo) / "refs" / revision
    return ref.read_text().strip() if ref.is_file() else None


def cached_files(repo: str, revision: str = "main") -> list[str]:
    commit = cached_commit(repo, revision)
    snap = storage_folder(repo) / "snapshots" / (commit or "-")
    if not snap.is_dir():
        return []
    return sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())


def cached_path(ref: HubRef) -> Path | None:
    """The first (or only) file of `ref` in the hub cache, or None; reads only the disk."""
    names = cached_files(ref.repo, ref.revision)
    try:
        chosen = select_files(names, ref)
    except HubError:
        return None
    snap = storage_folder(ref.repo) / "snapshots" / cached_commit(ref.repo, ref.revision)
    return snap / chosen[0]


# -- pulling --------------------------------------------------------------------------------------------------

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _git_sha1_file(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def verify_blob(path: Path, etag: str) -> str:
    """Check a downloaded file against its etag (sha256 for LFS files, git sha1 otherwise); returns the kind."""
    if re.fullmatch(r"[0-9a-f]{64}", etag):
        kind, got = "sha256", _sha256_file(path)
    elif re.fullmatch(r"[0-9a-f]{40}", etag):
        kind, got = "git-sha1", _git_sha1_file(path)
    else:
        return "none (the hub gave no checksum)"
    if got != etag:
        raise HubError(f"{path.name}: {kind} mismatch (expected {etag}, got {got}); the partial download was "
                       "deleted, run the pull again")
    return kind


def list_repo_files(repo: str, revision: str = "main") -> list[str]:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint()).list_repo_files(repo, revision=revision)


def _download(repo: str, filename: str, revision: str, log) -> Path:
    """One file into the hub cache, resuming a previous partial download; returns the snapshot path."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import http_get

    ep, cache = endpoint(), cache_root()
    meta = get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision, endpoint=ep), endpoint=ep)
    blob = storage_folder(repo) / "blobs" / meta.etag
    if not blob.exists() and meta.xet_file_data is None:
        part = blob.with_name(meta.etag + ".localspec.part")
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have:
            log(f"localspec: resuming {filename} at {have:,} of {meta.size or 0:,} bytes")
        with part.open("r+b" if have else "wb") as f:
            f.seek(have)
            http_get(meta.location, f, resume_size=have, expected_size=meta.size, displayed_filename=filename)
        try:
            kind = verify_blob(part, meta.etag)
        except HubError:
            part.unlink(missing_ok=True)
            raise
        log(f"localspec: {filename}: {kind} verified")
        part.replace(blob)
    # xet-stored files (hf_xet resumes by chunk) and the snapshot link: the client's own path
    return Path(hf_hub_download(repo, filename, revision=revision, cache_dir=str(cache), endpoint=ep))


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def unreachable() -> str | None:
    """Why the endpoint cannot be reached (one TCP connect, 5 s), or None. Skipped behind a proxy, where only
    the proxy knows. Saves the client's five silent retries (~25 s) when there is no network at all."""
    import socket
    from urllib.parse import urlsplit

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


def pull(ref: HubRef, *, log=print, verbose: bool = False) -> Path:
    """Download every file `ref` needs (all shards) into the hub cache; returns the first file's path."""
    if is_offline():
        raise HubError(f"offline (HF_HUB_OFFLINE is set): cannot pull {ref.repo}; unset it and retry")
    why = unreachable()
    if why:
        raise HubError(f"cannot reach {endpoint()} ({why}): no network? check it or HF_ENDPOINT, then run the "
                       "pull again (it resumes)")
    with hub_logs(verbose):
        return _pull(ref, log)


def _pull(ref: HubRef, log) -> Path:
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        names = list_repo_files(ref.repo, ref.revision)
        chosen = select_files(names, ref)
        paths = [_download(ref.repo, name, ref.revision, log) for name in chosen]
    except RepositoryNotFoundError:
        raise HubError(f"repository {ref.repo} not found on {endpoint()} (private or gated repos need "
                       "'hf auth login')") from None
    except HfHubHTTPError as e:
        raise HubError(f"{ref.repo}: {str(e).splitlines()[0]}; run the pull again (it resumes)") from None
    except OSError as e:
        raise HubError(f"{ref.repo}: download failed ({e}); run the pull again to resume") from None
    except Exception as e:  # the client's transport errors (httpx/requests) carry no common base we can import
        if type(e).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore", "httpcore2", "requests"):
            raise
        raise HubError(f"cannot reach {endpoint()} ({e}); check the network or HF_ENDPOINT, then run the pull "
                       "again (it resumes)") from None
    return paths[0]


def remove(ref: HubRef) -> list[Path]:
    """Delete the cached files of `ref` (snapshot links and their blobs); returns what was removed."""
    names = cached_files(ref.repo, ref.revision)
    try:
        chosen = select_files(names, ref)
    except HubError:
        return []
    snap = storage_folder(ref.repo) / "snapshots" / cached_commit(ref.repo, ref.revision)
    removed = []
    for name in chosen:
        link = snap / name
        target = link.resolve()
        link.unlink()
        removed.append(link)
        if target != link and target.exists():
            target.unlink()
    return removed

