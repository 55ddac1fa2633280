"""What a drafter's rounds measured, kept between runs, so the next start of a pair begins from its measurement.

Acceptance belongs to a (target, drafter) pair: the controller learns it per draft source from the rounds
(estimate.py), and without this file it would start every run from a prior again. So each model-drafted
source's counts are written here, one small JSON file per pair of files (path, size and modification time, as
the calibration cache keys them), in a folder beside the calibration cache. Reading them back:

- counts fade with age (half their weight every `HALF_LIFE_DAYS`), so a stale measurement leans back toward the
  prior it came from, and the trial (controller.py) measures again once it no longer decides;
- the first position's count is capped at `KEEP_N`: a kept measurement is worth a few dozen rounds, so a
  session's own rounds soon outweigh it where its text differs.

Prompt lookup is not kept: its acceptance is a property of each request's text, not of a pair of files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..lifecycle import temp_name
from ..models import LOOKUP
from ..models.paths import calibration_dir

HALF_LIFE_DAYS = 7.0
KEEP_N = 24.0  # at most this many first-position observations come back from the file
SAVE_EVERY_S = 5.0  # a server writes at most this often (and at close): one request's counts are not worth more


@dataclass(frozen=True)
class Kept:
    """One source's decayed acceptance counts per draft position (estimate.SourceEstimate's n and a)."""

    n: tuple[float, ...]
    a: tuple[float, ...]
    rounds: int
    at: float  # when they were written (seconds since the epoch)
    judged: bool = False  # the trial that measured them ended (trial.py): no new trial is due
    on: bool = False  # ... and whether the source was drafting when they were written: the next start resumes it

    def faded(self, now: float) -> "Kept":
        """The counts as they weigh now: halved every HALF_LIFE_DAYS, then capped at KEEP_N. A judgement older
        than one half-life is due again: the next run tries the drafter anew, from the faded counts."""
        age = max(0.0, now - self.at) / (86400 * HALF_LIFE_DAYS)
        w = 0.5 ** age
        if self.n and self.n[0] * w > KEEP_N:
            w = KEEP_N / self.n[0]
        return Kept(tuple(w * x for x in self.n), tuple(w * x for x in self.a), self.rounds, self.at,
                    self.judged and age < 1, self.on)

    @property
    def alpha(self) -> float | None:
        """The first position's acceptance as measured, or None with nothing observed."""
        return self.a[0] / self.n[0] if self.n and self.n[0] > 0 else None

    def to_dict(self) -> dict:
        return {"n": [round(x, 4) for x in self.n], "a": [round(x, 4) for x in self.a], "rounds": self.rounds,
                "at": round(self.at, 1), "judged": self.judged, "on": self.on}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Kept":
        n, a = tuple(float(x) for x in d["n"]), tuple(float(x) for x in d["a"])
        if len(n) != len(a) or any(x < 0 or y < 0 or y > x + 1e-6 for x, y in zip(n, a)):
            raise ValueError("inconsistent counts")
        return cls(n, a, int(d.get("rounds", 0)), float(d["at"]), bool(d.get("judged", False)),
                   bool(d.get("on", False)))


def kept_sources(sources: Mapping[str, Kept]) -> dict[str, Kept]:
    """The sources worth keeping: those a pair of files decides (not prompt lookup's), with something observed."""
    return {s: k for s, k in sources.items() if s.split(":", 1)[0] != LOOKUP and k.n and k.n[0] > 0}


class AcceptanceStore:
    """The kept acceptance of one (target, drafter) pair of files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved_at = 0.0

    @classmethod
    def for_pair(cls, target: Path, drafter: Path) -> "AcceptanceStore":
        return cls(acceptance_path(target, drafter))

    def load(self, now: float | None = None) -> dict[str, Kept]:
        """Every kept source, faded to `now`; empty when there is no file or it is damaged (measured again)."""
        now = time.time() if now is None else now
        try:
            d = json.loads(self.path.read_text())
            return {s: Kept.from_dict(k).faded(now) for s, k in d["sources"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def save(self, sources: Mapping[str, Kept], *, force: bool = False) -> bool:
        """Write the sources worth keeping (atomically: a reader never sees half a file). Unless `force`, at most
        every SAVE_EVERY_S; True when written."""
        now = time.monotonic()
        keep = kept_sources(sources)
        if not keep or (not force and now - self._saved_at < SAVE_EVERY_S):
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_name(self.path)
            tmp.write_text(json.dumps({"sources": {s: k.to_dict() for s, k in keep.items()}}, indent=1))
            tmp.replace(self.path)
        except OSError:
            return False  # a read-only cache only costs the next start its trial
        self._saved_at = now
        return True


def acceptance_dir() -> Path:
    """Beside the calibration cache, or LOCALSPEC_ACCEPTANCE (the test suite gives each test its own)."""
    env = os.environ.get("LOCALSPEC_ACCEPTANCE")
    return Path(env) if env else calibration_dir() / "acceptance"


def file_id(path: Path) -> dict:
    """A file as the caches key it: a rewritten file (another size or mtime) is another file."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def acceptance_path(target: Path, drafter: Path) -> Path:
    """The file of this pair: a digest of both files' identities (a rewritten file starts afresh)."""
    key = json.dumps({"target": file_id(target), "draft": file_id(drafter)}, sort_keys=True)
    return acceptance_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def kept_for(target: str | Path, drafter: str | Path, source: str = "model") -> Kept | None:
    """What the rounds measured for this pair's `source`, faded to now, or None (never measured, or a file gone)."""
    try:
        path = acceptance_path(Path(target).expanduser(), Path(drafter).expanduser())
    except OSError:
        return None
    return AcceptanceStore(path).load().get(source)
