"""Which drafter a target gets: the one named, `--draft auto` (the best predicted local file with the target's
tokenizer), `--draft self` (its low-bit copy), the registry's pairing, the model's own MTP heads, else prompt lookup;
and one warning, with the numbers, when a drafter is too large to pay even if every draft were accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IncompatibleDrafter, ModelLoadError
from ..models import LOOKUP
from ..models.nextn import nextn_heads
from ..models.registry import load_registry
from ..speculative.mtp import MTP
from ..tuning.sources import DEFAULT_K

if TYPE_CHECKING:
    from .engine import Engine
    from .loader import EngineConfig


AUTO = "auto"  # --draft auto: the best local drafter with the target's tokenizer (tuning/predict.rank)
SELF = "self"  # --draft self: the target's low-bit copy that `localspec models make-drafter` wrote


def choose_drafter(config: EngineConfig, model_name: str, target_path: Path | None = None,
                   log=print) -> tuple[str, int]:
    """(drafter, k): explicit choice first (AUTO and SELF resolved to a file here), else what models.toml pairs
    with the model, else the model's own MTP heads where its GGUF has them, else prompt lookup."""
    pair = load_registry().pair_for(model_name)
    own = MTP if target_path is not None and nextn_heads(target_path) > 0 else LOOKUP
    draft = config.draft or (pair.drafter if pair else own)
    k = config.k if config.k is not None else (pair.k if pair else DEFAULT_K)
    if draft in (AUTO, SELF) and target_path is not None:
        draft = auto_drafter(target_path, model_name, self_only=draft == SELF, dirs=config.models_dirs, log=log)
    return draft, k


def auto_drafter(target: Path, name: str, *, self_only: bool = False, dirs: tuple[str, ...] = (),
                 log=print) -> str:
    """The fastest predicted local drafter with the target's tokenizer, said in one line; none: prompt lookup,
    said so. `self_only`: the target's own low-bit copy, refused when there is none."""
    from ..models.candidates import self_drafters
    from ..tuning.predict import predict, rank

    if self_only:
        own = self_drafters(target)
        if not own:
            raise IncompatibleDrafter(f"{name} has no self drafter yet: run 'localspec models make-drafter "
                                      f"{target}' (or use --draft auto / --lookup)")
        p = predict(target, own[0])
        log(f"localspec: drafter {own[0].name} (self copy of {name}): predicted {p.speedup:.2f}x at k={p.k} "
            f"({p.basis()})")
        return str(own[0])
    usable = [(r, r.prediction) for r in rank(target, dirs) if r.prediction is not None]
    if not usable or usable[0][1].speedup <= 1.0:
        why = "no local GGUF has its tokenizer" if not usable else (
            f"the best, {usable[0][0].match.file.name}, is predicted {usable[0][1].speedup:.2f}x")
        log(f"localspec: --draft auto: prompt lookup for {name} ({why})")
        return LOOKUP
    best, pred = usable[0]
    log(f"localspec: --draft auto: {best.match.file.name} ({best.match.file.origin}, same tokenizer): predicted "
        f"{pred.speedup:.2f}x at k={pred.k} ({pred.basis()}; {len(usable) - 1} other candidates)")
    return str(best.match.file.path)


def warn_if_too_large(target: Path, drafter: Path, name: str, log=print, *, ngl: int = 0,
                      ngl_draft: int = 0) -> bool:
    """A drafter too large to pay gets one warning with the numbers: one that would slow the target down at every
    γ even if the target accepted every draft (α = 1), so the verdict does not rest on the acceptance prior, only
    on its cost c and v(γ). Below that, the adaptive controller finds out by measuring and switches off.

    c and v(γ) come from calibrations made with this placement (--ngl, --ngl-draft). With the target and the
    drafter on different devices (one offloaded to a GPU, the other on the CPU) file sizes say nothing about c,
    so only such a calibration judges before the load: False when there is none, and
    `warn_if_measured_too_large` judges after the load's calibration."""
    from ..tuning.predict import measured, predict

    split = split_devices(ngl, ngl_draft)
    try:
        p = predict(target, drafter, alpha=1.0, costs=measured(target, ngl=ngl, draft_ngl=ngl_draft))
    except (ModelLoadError, OSError, ValueError, KeyError):  # advisory only: a file it cannot judge loads as before
        return True
    if split and not p.c_measured:
        return False
    if p.speedup < 1.0:
        basis = p.basis().rsplit(", α", 1)[0]  # c and v(γ): α is not a prior here
        _say_too_large(log, name, target.name, p.speedup, p.k, basis)
    return True


def split_devices(ngl: int, ngl_draft: int) -> bool:
    """Whether the target and the drafter run on different devices (a GPU build, one of them offloaded)."""
    from ..backend import supports_gpu_offload

    return bool(ngl) != bool(ngl_draft) and supports_gpu_offload()


def warn_if_measured_too_large(engine: Engine, name: str, log=print) -> None:
    """The warning above from the c and v(γ) the load's calibration measured where each model runs (nothing is
    said when nothing was measured)."""
    from ..tuning.rate import best_k

    st = engine.controller.state()
    c, v = st.c.get("model"), st.v
    if c is None or len(v) < 2:
        return
    k, rate = best_k([1.0], c, v, 1, len(v) - 1)
    if rate < 1.0:
        _say_too_large(log, name, engine.target.path.name, rate, k,
                       f"c {c:.2f} measured, v(γ) measured, on different devices")


def _say_too_large(log, name: str, target: str, speedup: float, k: int, basis: str) -> None:
    log(f"localspec: warning: drafter {name} is too large to pay for {target}: even with every draft "
        f"accepted it would run at {speedup:.2f}x at best (k={k}; {basis}): a smaller drafter or "
        "--lookup should pay")
