"""The speedup a drafter should give a target here, before it is loaded: rate(γ) at this machine's costs.

    speedup = max over γ of E(γ) / (γ·c + v(γ))         (rate.py; plain decoding is 1)

- v(γ) comes from the target's calibration cache entries (calibration.py writes them at every load); with none,
  rate.v_at's guess for a quiet CPU.
- c comes from an entry that measured this very pair; else it is predicted from the weight bytes: a batch-1
  step reads every weight once, so a drafter's step is about its file size over the target's.
- α is what earlier runs of this very pair measured, kept per pair of files (acceptance.py); else a prior: the
  target's own low-bit copy agrees with it most of the time, another model of the family less. The figure says
  which of its parts were measured and which assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..models.candidates import (
    SELF_QUANTS,
    Match,
    RegistryOffer,
    matches,
    registry_offers,
    same_shapes,
    self_copy_bytes,
    self_drafters,
)
from ..models.paths import calibration_dir
from .acceptance import kept_for
from .estimate import SourceEstimate
from .rate import best_k

ALPHA_SELF = 0.8  # prior acceptance of the target's own low-bit copy
ALPHA_OTHER = 0.6  # prior acceptance of another model with the same tokenizer
K_MAX = 8


@dataclass(frozen=True)
class Measured:
    """What the calibration cache holds for one target file."""

    v: tuple[float, ...] = ()
    c: dict[str, float] | None = None  # drafter path (resolved) -> measured c


def _same_file(d: dict | None, path: Path) -> bool:
    if not d:
        return False
    try:
        st = path.stat()
        return d["path"] == str(path.resolve()) and d["size"] == st.st_size and d["mtime_ns"] == st.st_mtime_ns
    except (OSError, KeyError):
        return False


def measured(target: str | Path, *, ngl: int | None = None, draft_ngl: int | None = None) -> Measured:
    """The longest v(γ) any cached calibration of this file measured, and every c measured with a drafter;
    with `ngl` (and `draft_ngl`), only calibrations made with the target (and the drafter) placed so: a target
    on a GPU and a drafter on the CPU cost nothing like two models on one device."""
    t = Path(target).expanduser()
    v: tuple[float, ...] = ()
    c: dict[str, float] = {}
    for f in sorted(calibration_dir().glob("*.json")):
        try:
            d = json.loads(f.read_text())
            key, costs = d["key"], d["calibration"].get("costs")
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if not costs or not _same_file(key.get("target"), t) or (ngl is not None and key.get("ngl") != ngl):
            continue
        if draft_ngl is not None and key.get("draft") and key.get("draft_ngl") != draft_ngl:
            continue
        vs = tuple([1.0] + [float(x) for _, x in sorted((int(g), x) for g, x in costs.get("v", {}).items())])
        if len(vs) > len(v):
            v = vs
        if key.get("draft") and "model" in costs.get("c", {}):
            c[key["draft"]["path"]] = float(costs["c"]["model"])
    return Measured(v, c)


@dataclass(frozen=True)
class Prediction:
    speedup: float  # predicted tokens/s over plain decoding's, at the best γ
    k: int  # that γ
    alpha: float
    c: float
    c_measured: bool
    v_measured: bool
    self_copy: bool  # the target's own tensors at fewer bits
    alpha_rounds: int = 0  # rounds of earlier runs that measured α (0: α is the prior of the drafter's kind)

    def basis(self) -> str:
        """How the figure was made, in words."""
        c = f"c {self.c:.2f} " + ("measured" if self.c_measured else "from file sizes")
        v = "v(γ) measured" if self.v_measured else "v(γ) guessed (no calibration yet)"
        if self.alpha_rounds:
            a = f"α {self.alpha:.2f} measured over {self.alpha_rounds} rounds"
        else:
            a = f"α prior {self.alpha:.2f}" + (" (own copy)" if self.self_copy else "") + ", not measured yet"
        return f"{c}, {v}, {a}"


def predict(target: str | Path, drafter: str | Path, *, costs: Measured | None = None,
            alpha: float | None = None) -> Prediction:
    """The predicted speedup of `drafter` for `target` on this machine (both files must exist)."""
    t, d = Path(target).expanduser(), Path(drafter).expanduser()
    costs = costs if costs is not None else measured(t)
    own = same_shapes(t, d)
    a = alpha if alpha is not None else ALPHA_SELF if own else ALPHA_OTHER
    c_known = (costs.c or {}).get(str(d.resolve()))
    c = c_known if c_known is not None else d.stat().st_size / max(t.stat().st_size, 1)
    kept = kept_for(t, d) if alpha is None else None
    if kept is None:
        return _at(a, c, costs, c_measured=c_known is not None, own=own)
    est = SourceEstimate(alpha_prior=a, c=c)  # the counts over the prior, as the controller weighs them
    est.seed(kept.n, kept.a, kept.rounds)
    alphas = est.alphas(K_MAX)
    k, rate = best_k(alphas, c, costs.v, 1, K_MAX)
    return Prediction(rate, k, alphas[0], c, c_known is not None, bool(costs.v), own, alpha_rounds=kept.rounds)


def _at(alpha: float, c: float, costs: Measured, *, c_measured: bool, own: bool) -> Prediction:
    k, rate = best_k([alpha], c, costs.v, 1, K_MAX)
    return Prediction(rate, k, alpha, c, c_measured, bool(costs.v), own)


def predict_size(target: str | Path, drafter_bytes: int, *, costs: Measured | None = None,
                 own: bool = False) -> Prediction:
    """The predicted speedup of a drafter known only by its size (a registry model not pulled yet, or the self
    copy make-drafter has not written): c is its bytes over the target's, as for a file whose c was never
    measured; α the prior of its kind."""
    t = Path(target).expanduser()
    costs = costs if costs is not None else measured(t)
    return _at(ALPHA_SELF if own else ALPHA_OTHER, drafter_bytes / max(t.stat().st_size, 1), costs,
               c_measured=False, own=own)


def predict_self_copy(target: str | Path, quant: str = SELF_QUANTS[0], *,
                      costs: Measured | None = None) -> tuple[int, Prediction] | None:
    """(estimated bytes, prediction) of the low-bit copy `make-drafter` would write, when it has not and the copy
    would be much smaller than the target (a Q4_0 copy of a Q4_0 file drafts nothing faster)."""
    t = Path(target).expanduser()
    if self_drafters(t):
        return None
    est = self_copy_bytes(t, quant)
    if est > 0.8 * t.stat().st_size:
        return None
    return est, predict_size(t, est, costs=costs, own=True)


@dataclass(frozen=True)
class Ranked:
    match: Match
    prediction: Prediction | None  # None: it cannot draft for the target


def rank(target: str | Path, dirs: Iterable[str | Path] = ()) -> list[Ranked]:
    """Every local file checked against the target: those that may draft first, fastest predicted first; the
    rest after, with their reasons. Ties go to the smaller file."""
    costs = measured(target)
    out = [Ranked(m, predict(target, m.file.path, costs=costs) if m.ok else None) for m in matches(target, dirs)]
    return sorted(out, key=lambda r: (r.prediction is None, -(r.prediction.speedup if r.prediction else 0),
                                      r.match.size_bytes))


@dataclass(frozen=True)
class Offered:
    offer: RegistryOffer
    prediction: Prediction | None  # None: its size is unknown until it is pulled


def rank_registry(target: str | Path) -> list[Offered]:
    """The models.toml drafters not on disk (candidates.registry_offers), fastest predicted first; those of unknown
    size last, a pair's drafter before a family guess."""
    costs = measured(target)
    out = [Offered(o, predict_size(target, o.size_bytes, costs=costs) if o.size_bytes else None)
           for o in registry_offers(target)]
    return sorted(out, key=lambda r: (r.prediction is None, -(r.prediction.speedup if r.prediction else 0),
                                      not r.offer.paired, r.offer.size_bytes or 0))
