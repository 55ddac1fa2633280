"""One file's bytes from the hub, as hub.py's pull fetches them: a ranged GET into our own partial file,
resumed after a dropped connection or a killed process, then checked against the hub's etag (sha256 for LFS
files, git sha1 otherwise) before hub.py moves it into the cache.

Why not the client's download: since huggingface-hub 1.x it deletes its partial file when a download fails,
and a GGUF is gigabytes. The bytes still go over the client's own HTTP session, headers and progress bar.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ..errors import HubError

Log = Callable[[str], None]
# a transfer's progress, as the bytes arrive: (file name, its etag (an LFS file's sha256), bytes in place, total)
Progress = Callable[[str, str, int, "int | None"], None]


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


def _partial(cache: str, etag: str) -> Path:
    """Our resumable partial download: in the hub cache's folder (same disk as the file's final place)."""
    return Path(cache) / ".localspec-downloads" / f"{etag}.localspec.part"


def is_transport_error(e: BaseException) -> bool:
    """The client's transport errors (httpx/requests) have no common base we can import across versions."""
    return type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2", "requests")


def _get_range(url: str, part: Path, headers: dict[str, str], size: int | None, filename: str, etag: str,
               progress: Progress | None) -> None:
    """One GET from the end of `part` to the end of the file, appended as the bytes arrive."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import hf_raise_for_status, tqdm

    have = part.stat().st_size if part.exists() else 0
    if size is not None and have >= size:
        return
    with get_session().stream("GET", url, headers={**headers, **({"Range": f"bytes={have}-"} if have else {})},
                              follow_redirects=True) as r:
        hf_raise_for_status(r)
        if have and r.status_code == 200:  # the server ignored the range: start over
            have = 0
        with part.open("r+b" if have else "wb") as f, tqdm(total=size, initial=have, unit="B", unit_scale=True,
                                                            desc=filename) as bar:
            f.seek(have)
            for chunk in r.iter_bytes():
                f.write(chunk)
                bar.update(len(chunk))
                have += len(chunk)
                if progress is not None:
                    progress(filename, etag, have, size)


def fetch(url: str, etag: str, size: int | None, filename: str, log: Log, *, cache: str, hub: str, tries: int = 5,
          progress: Progress | None = None) -> Path:
    """The file at `url` in our partial file under `cache`, resumed across dropped connections and runs,
    checked by `etag`. `hub` is the endpoint: a URL elsewhere (a signed CDN URL) gets no token."""
    from huggingface_hub.utils import build_hf_headers

    part = _partial(cache, etag)
    part.parent.mkdir(parents=True, exist_ok=True)
    if part.exists():
        log(f"localspec: resuming {filename} at {part.stat().st_size:,} of {size or 0:,} bytes")
    headers = build_hf_headers()
    if urlsplit(url).netloc != urlsplit(hub).netloc:
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the hub, as the client does
    for attempt in range(tries):
        before = part.stat().st_size if part.exists() else 0
        try:
            _get_range(url, part, headers, size, filename, etag, progress)
            break
        except Exception as e:
            if not is_transport_error(e) or attempt == tries - 1:
                raise
            if part.exists() and part.stat().st_size > before:
                continue  # it moved: resume at once
            time.sleep(min(2**attempt, 8))
    try:
        kind = verify_blob(part, etag)
    except HubError:
        part.unlink(missing_ok=True)
        raise
    log(f"localspec: {filename}: {kind} verified")
    return part
