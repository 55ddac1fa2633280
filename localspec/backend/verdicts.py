"""A load-time trial's verdict kept beside the calibrations, one small JSON file per key: the CPU fast paths'
(fastpath.py, keyed in fastpath_cache.py) and flash attention's on a device (devicefa.py). A warm start reads the
file instead of running the trial again; a key that changed (another build, another model layout) finds none."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Mapping

from ..models.paths import calibration_dir


def _file(kind: str, key: Mapping) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return calibration_dir() / f"{kind}-{digest}.json"


def read_verdict(kind: str, key: Mapping) -> dict | None:
    """The `kind` of verdict kept for `key`, or None (none kept, another key, unreadable)."""
    try:
        d = json.loads(_file(kind, key).read_text())
        return d if isinstance(d, dict) and d.get("key") == key else None
    except (OSError, ValueError):
        return None


def write_verdict(kind: str, key: Mapping, verdict: Mapping) -> None:
    """Keep a `kind` of verdict for `key`; a read-only cache only costs the next start its trial."""
    write_json(_file(kind, key), {"key": dict(key), **verdict})


def write_json(p: Path, data: object) -> None:
    """Write `data` to `p` whole or not at all (a temporary file renamed over it); a read-only folder is no error."""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(p)
    except OSError:
        pass
