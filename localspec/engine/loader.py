"""From command-line choices to a ready `Engine`: resolve names, check the pair, load both models, assemble.

The one way to build an engine: `run`, `chat` and `serve` call `load_engine`; `bench` loads each target once and
builds every row's Engine with `assemble`, so its "auto" row is the shipped default. Every front end refuses a
bad pair with `check_drafter`'s words.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from ..backend import LoadOptions, Model, add_rpc_servers, devicefa, in_own_thread
from ..backend.machine import CpuMeter
from ..errors import ContextTooLarge, IncompatibleDrafter, ModelLoadError
from ..models import LOOKUP
from ..models.footprint import footprint
from ..models.model_facts import trained_context
from ..models.nextn import nextn_heads
from ..models.pairing import check_pair
from ..models.registry import load_registry
from ..models.resolve import resolve_model
from ..speculative.drafters import HybridDrafter, ModelDrafter, PromptLookup
from ..speculative.mtp import MTP, MtpDrafter
from ..speculative.reindent import Indents
from ..speculative.structure import STRUCTURE, StructureDrafter
from ..speculative.suffix import SuffixCache
from ..speculative.types import NO_DRAFTER, Controller, Drafter
from ..tuning.acceptance import AcceptanceStore, Kept
from ..tuning.calibration import Calibration
from ..tuning.controller import Adaptive
from ..tuning.fixed import FixedK
from ..tuning.sources import DEFAULT_K, K_MAX, K_MAX_LOOKUP, K_MIN, k_range
from ..tuning.threads import ThreadControl
from .drafter_choice import AUTO, SELF, choose_drafter, warn_if_measured_too_large, warn_if_too_large
from .engine import Engine

if TYPE_CHECKING:
    from ..backend.mtp import TimedHead

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class EngineConfig:
    """What to load. `draft` is a model name/path, LOOKUP, NO_DRAFTER, or None for the registry's pairing."""

    model: str | None = None
    draft: str | None = None
    k: int | None = None
    n_ctx: int | None = None
    threads: int | None = None
    ngl: int | None = 0  # None: the model's n_gpu_layers from models.toml, else 0
    ngl_draft: int | None = None
    verbose: bool = False
    load: LoadOptions = LoadOptions()
    adaptive: bool = True  # choose γ per round and switch speculation off when it does not pay
    k_min: int = K_MIN  # adaptive range; an explicit k pins γ (auto-off stays on unless adaptive=False)
    k_max: int = K_MAX
    hybrid: bool = False  # with a model drafter: prompt lookup first, the model when lookup has no match
    p_min: float = 0.0  # model drafter stops early below this top probability (0 = never)
    lookup_cache: int = 16384  # tokens of earlier requests prompt lookup may draft from (0 = this request only)
    models_dirs: tuple[str, ...] = ()  # folders --draft auto searches besides models.toml and the hub cache
    k_max_lookup: int = K_MAX_LOOKUP  # with lookup and k_max left at its default (tuning/sources.k_range)
    structure: bool = False  # draft the text a request's grammar forces first, the drafter above otherwise


def _entry_ngl(entry, default: int) -> int:
    return entry.n_gpu_layers if entry is not None and entry.n_gpu_layers is not None else default


def _draft_ngl(config: EngineConfig, target_name: str, draft_ref, ngl: int) -> int:
    """--ngl-draft, else the pair's n_gpu_layers_draft, else the drafter's n_gpu_layers, else --ngl (if given)."""
    pair = load_registry().pair_for(target_name)
    if config.ngl is None and pair and pair.drafter == draft_ref.name and pair.n_gpu_layers_draft is not None:
        return pair.n_gpu_layers_draft
    return config.ngl if config.ngl is not None else _entry_ngl(draft_ref.entry, ngl)


def context_length(config: EngineConfig, ref) -> int:
    """--ctx (refused above the trained context), else models.toml's n_ctx or 4096, capped at the trained one."""
    if config.n_ctx:
        check_context(ref.path, ref.name, config.n_ctx, config.load)
        return config.n_ctx
    n_ctx = ref.entry.n_ctx if ref.entry and ref.entry.n_ctx else DEFAULT_CTX
    try:
        return min(n_ctx, trained_context(ref.path) or n_ctx)
    except ModelLoadError:  # not a readable GGUF: llama.cpp's load says why
        return n_ctx


def check_context(path, name: str, n_ctx: int, load: LoadOptions) -> None:
    """Refuse a context above what the model was trained for, before its KV cache is allocated (llama.cpp
    only warns, then quality collapses past the trained length)."""
    try:
        trained = trained_context(path)
    except ModelLoadError:  # not a readable GGUF: llama.cpp's load says why
        return
    if trained and n_ctx > trained:
        gb = footprint(path, n_ctx, type_k=load.type_k, type_v=load.type_v).kv / 1e9
        raise ContextTooLarge(f"--ctx {n_ctx} is above the trained context of {name} ({trained} tokens; a KV "
                              f"cache of {n_ctx} tokens would take {gb:.1f} GB): use --ctx {trained} or less")


def load_engine(config: EngineConfig, *, controller: Controller | None = None, log=print) -> Engine:
    """Resolve, check, load and calibrate: the Engine a front end generates from."""
    meter = CpuMeter()  # reads the machine while the models load: how busy calibration found it
    target_ref = resolve_model(config.model, log=log)
    if config.load.rpc_servers:  # a dead or wrong address is one line before any model loads
        add_rpc_servers(config.load.rpc_servers)
    draft, k = choose_drafter(config, target_ref.name, target_ref.path, log=log)
    n_ctx = context_length(config, target_ref)
    ngl = config.ngl if config.ngl is not None else _entry_ngl(target_ref.entry, 0)
    opts = replace(config.load, n_ctx=n_ctx, n_threads=config.threads, n_gpu_layers=ngl, verbose=config.verbose,
                   mtp=draft == MTP)
    if draft == MTP and nextn_heads(target_ref.path) == 0:
        raise IncompatibleDrafter(f"{target_ref.name} carries no MTP heads to draft with "
                                  "(use --draft NAME or --lookup)")
    draft_model: Model | None = None
    eagle3: Path | None = None  # an EAGLE-3 drafter file: it runs beside the target, made once the target is loaded
    judged = True  # the drafter's size judged before the load (warn_if_too_large)
    if draft not in (LOOKUP, NO_DRAFTER, MTP):
        draft_ref = resolve_model(draft, log=log)
        check_drafter(target_ref.path, draft_ref.path, target_name=target_ref.name, drafter_name=draft_ref.name)
        eagle3 = draft_ref.path if _is_eagle3(draft_ref.path) else None
    if draft not in (LOOKUP, NO_DRAFTER, MTP) and eagle3 is None:
        ngl_d = config.ngl_draft
        if ngl_d is None:
            ngl_d = _draft_ngl(config, target_ref.name, draft_ref, ngl)
        if config.draft not in (AUTO, SELF):
            judged = warn_if_too_large(target_ref.path, draft_ref.path, draft_ref.name, log=log, ngl=ngl,
                                       ngl_draft=ngl_d)
        if config.n_ctx:
            check_context(draft_ref.path, draft_ref.name, n_ctx, config.load)
        draft_model = Model.load(draft_ref.path, replace(opts.local(), n_gpu_layers=ngl_d))  # stays local
        draft = draft_ref.name
    target = Model.load(target_ref.path, opts)
    for m in (target, draft_model):
        if m is not None:
            tell_fast_path(m, log)
            devicefa.settle(m, log)  # flash attention on a GPU device: tested once per device and build
    devicefa.name_suspect([m for m in (target, draft_model) if m is not None])  # for a crash line
    template = target_ref.entry.chat_template if target_ref.entry else None
    if eagle3 is not None:
        draft = draft_ref.name
    engine = assemble(replace(config, draft=draft), target, draft_model, name=target_ref.name, template=template,
                      k=k, meter=meter, controller=controller, mtp=make_eagle3(target, eagle3) if eagle3 else None)
    if not judged and engine.drafter is not None:
        warn_if_measured_too_large(engine, draft, log=log)
    return engine


def assemble(config: EngineConfig, target: Model, draft_model: Model | None = None, *, name: str = "",
             template: str | None = None, k: int = DEFAULT_K, meter: CpuMeter | None = None,
             controller: Controller | None = None, mtp: MtpDrafter | None = None) -> Engine:
    """The Engine over models already loaded: drafter, calibration, γ controller and thread control, built the
    one way every front end gets them (`load_engine`, and the bench, which loads a target once for all its
    rows). `config.draft` is resolved here: LOOKUP, NO_DRAFTER, MTP, or the name of `draft_model`. `mtp` is the
    target's head drafter when the caller made it already: a target reports its decodes to one head, so the
    bench's rows share one; or, with no `draft_model`, the EAGLE-3 drafter file `load_engine` made. FixedK's γ
    is `config.k`, else `k` (the registry pair's)."""
    k = config.k if config.k is not None else k
    draft = config.draft or NO_DRAFTER
    own_heads = draft == MTP  # the target's own MTP heads draft (alone or after lookup)
    drafter: Drafter | None = None
    head: TimedHead | None = None  # the drafter's engine whose c the calibration times
    if own_heads:
        mtp = mtp or make_mtp(target)
    if draft == LOOKUP:
        drafter = make_lookup(config, target)
    elif draft != NO_DRAFTER:
        if mtp is not None and (own_heads or draft_model is None):
            costly: Drafter = mtp
            head = _timed_head(mtp)
        elif draft_model is None:
            raise ValueError(f"drafter {draft} needs its loaded model")
        else:
            costly = ModelDrafter(draft_model, p_min=config.p_min)
        drafter = HybridDrafter(make_lookup(config, target), costly) if config.hybrid else costly
        draft = f"{LOOKUP}+{draft}" if config.hybrid else draft
    if config.structure:  # speculative/structure.py: forced text first, then the drafter (if any)
        drafter = StructureDrafter(target.piece, is_eog=target.is_eog, fallback=drafter)
        draft = STRUCTURE if draft == NO_DRAFTER else f"{STRUCTURE}+{draft}"
    cal = load_calibration(config, target, drafter, draft_model, meter, head=head)
    # a model drafter's (the file's own MTP heads', an EAGLE-3 or DFlash file's) acceptance, as earlier runs of
    # the pair measured it (tuning/acceptance.py)
    own = (draft_model.path if draft_model is not None else target.path if own_heads
           else getattr(head, "file", None))
    kept = AcceptanceStore.for_pair(target.path, own) if own is not None else None
    if controller is None and drafter is not None:
        controller = make_controller(config, k, drafter, cal, kept=kept.load() if kept else None)
    return Engine(target, drafter, controller=controller, name=name,
                  drafter_name=draft if drafter else NO_DRAFTER, chat_template=template,
                  threads=make_threads(config, target, draft_model, cal, meter),
                  acceptance=kept if config.adaptive else None)


def pair_problems(target: str | Path, drafter: str | Path) -> list[str]:
    """Every rule of llama.cpp's drafter/target compatibility the pair breaks (empty: it can draft)."""
    return check_pair(target, drafter)


def check_drafter(target: str | Path, drafter: str | Path, *, target_name: str = "",
                  drafter_name: str = "") -> None:
    """Refuse a drafter that cannot draft for the target, in the one wording every front end uses."""
    reasons = pair_problems(target, drafter)
    if reasons:
        raise IncompatibleDrafter(f"drafter {drafter_name or Path(drafter).name} cannot draft for "
                                  f"{target_name or Path(target).name}: " + "; ".join(reasons)
                                  + " (pick a drafter with the same tokenizer, or --lookup)")


_told: set[str] = set()


def tell_fast_path(model: Model, log=print) -> None:
    """Say in one line that a llama.cpp fast path was switched off and why, when the trial that found it ran
    (once per machine and build; `models show` and `bench` say it every time)."""
    notice = model.fast_path.notice()
    if notice and model.fast_path.source == "probe" and notice not in _told:
        _told.add(notice)
        log(f"localspec: {notice}")


def make_lookup(config: EngineConfig, target: Model) -> PromptLookup:
    """Prompt lookup with its own cross-request cache: one per engine, so per model (token ids are per vocab),
    and the target's indentation tokens (reindented copies)."""
    return PromptLookup(cache=SuffixCache(config.lookup_cache) if config.lookup_cache > 0 else None,
                        indents=Indents.of(target))


def make_mtp(target: Model) -> MtpDrafter:
    """The target's own MTP head(s) as its drafter (backend/mtp.py, chained heads: mtp_chain.py); its cost c comes
    from the calibration."""
    from ..backend.mtp_chain import open_head

    return MtpDrafter(open_head(target))


def _is_eagle3(path: Path) -> bool:
    """Whether `path` is an EAGLE-3 or DFlash drafter file (imported here: backend.eagle3 loads llama_cpp)."""
    from ..backend.dflash import is_dflash
    from ..backend.eagle3 import is_eagle3

    return is_eagle3(path) or is_dflash(path)


def make_eagle3(target: Model, path: Path) -> MtpDrafter:
    """An EAGLE-3 (or DFlash) drafter file as the target's drafter (backend/eagle3.py), fed the target's hidden
    states; its cost c comes from the calibration, timed as an MTP head's is (under the head's source)."""
    from ..backend.dflash import DFlashHead, is_dflash
    from ..backend.eagle3 import Eagle3Head
    from ..speculative.dflash import DFlashDrafter
    from ..speculative.eagle3 import Eagle3Drafter

    if is_dflash(path):  # a DFlash file: the same plumbing, a block drafted at once (backend/dflash.py)
        return DFlashDrafter(DFlashHead(target, path))
    return Eagle3Drafter(Eagle3Head(target, path))


def eagle3_drafters(target_name: str, drafters: Sequence[tuple[str, Path]], *,
                    mtp: bool = False) -> list[tuple[str, Path]]:
    """The EAGLE-3 (and DFlash) drafter files among (label, path) `drafters`; refused when they and the target's
    MTP heads (`mtp`) are more than one: each reads the target's hidden states, and a target reports its decodes
    to one."""
    files = [(label, path) for label, path in drafters if _is_eagle3(path)]
    if len(files) + mtp > 1:
        raise IncompatibleDrafter(f"{target_name}: its MTP heads and EAGLE-3/DFlash drafter files each read the "
                                  "target's hidden states, and a target feeds one: give them in separate runs")
    return files


def _timed_head(drafter: MtpDrafter) -> TimedHead | None:
    """The llama.cpp engine under an MTP or EAGLE-3 drafter, whose c the calibration times (a test's fake head,
    or chained heads, have none)."""
    from ..backend.eagle3 import Eagle3Head
    from ..backend.mtp import MtpHead

    head = drafter.head
    return head if isinstance(head, (MtpHead, Eagle3Head)) else None


def _k_range(config: EngineConfig, drafter: Drafter | None = None) -> tuple[int, int]:
    """γ's range for this drafter, within the longest draft it can make (a file's chained MTP heads: one each)."""
    lo, hi = k_range(drafter.sources if drafter is not None else (), k=config.k, k_min=config.k_min,
                     k_max=config.k_max, k_max_lookup=config.k_max_lookup)
    cap = getattr(drafter, "max_k", None)
    if cap:
        hi = min(hi, cap)
        lo = min(lo, hi)
    return lo, hi


def load_calibration(config: EngineConfig, target: Model, drafter: Drafter | None,
                     draft_model: Model | None, meter: CpuMeter | None = None, *,
                     head: TimedHead | None = None) -> Calibration | None:
    """One budgeted, cached calibration (calibration.py) seeds both controllers: γ's v and c (a model drafter's,
    or `head`'s: the target's own MTP head or an EAGLE-3 drafter file), and the step time per thread count. None
    when neither needs it (threads pinned and no adaptive drafting). The meter says how busy the machine is, so
    thread times measured on a busy one are not kept for a quiet one."""
    adaptive = drafter is not None and config.adaptive
    if config.threads and not adaptive:
        return None
    from ..tuning.calibration import calibrate

    # off this thread: a server loads on its main thread and decodes on a worker (backend/model.py, "Threads")
    k_max = _k_range(config, drafter)[1] if adaptive else 0
    return in_own_thread(calibrate, target, k_max=k_max, draft_model=draft_model,
                         threads=config.threads, others=meter.others if meter is not None else None, head=head)


def make_threads(config: EngineConfig, target: Model, draft_model: Model | None,
                 cal: Calibration | None, meter: CpuMeter | None = None) -> ThreadControl:
    """`--threads N` pins every phase; else the thread controller starts from the calibrated step times, with a
    CPU meter (started before the models loaded, so the first round already knows whether the machine is busy)."""
    if config.threads:
        return ThreadControl.pinned(target, draft_model, config.threads)
    return ThreadControl(target, draft_model, prior=cal.threads if cal else None, v=cal.v if cal else (),
                         meter=meter or CpuMeter())


def make_controller(config: EngineConfig, k: int, drafter: Drafter, cal: Calibration | None, *,
                    kept: Mapping[str, Kept] | None = None) -> Controller:
    """FixedK(k) with adaptive=False; else an `Adaptive` controller seeded by the load-time calibration of
    v(γ) (and c for a model drafter), and by the acceptance earlier runs of the pair measured (`kept`). An
    explicit -k pins γ but keeps auto-off."""
    if not config.adaptive:
        return FixedK(k)
    k_min, k_max = _k_range(config, drafter)
    costs = cal.costs if cal else None
    # c the drafter left to the calibration: a source's own (the MTP head's), else the model drafter's
    measured = {s: m for s, c in drafter.cost.items() if c is None and costs
                and (m := costs.c.get(s, costs.c.get("model"))) is not None}
    ctl = Adaptive(sources=drafter.sources, k_min=k_min, k_max=k_max, v=cal.v if cal else (),
                   t1=costs.t1 if costs else None, c={**drafter.cost, **measured}, prior=drafter.prior,
                   gammas=costs.timed if costs else (), kept=kept)
    ctl.calibration = cal
    return ctl
