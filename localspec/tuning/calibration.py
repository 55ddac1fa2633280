"""Load-time calibration: what this model costs on this machine, measured within a hard time budget and cached.

At load the engine needs priors for its two controllers: the γ controller's v(γ), t1 and c, and the thread
controller's step time per thread count and phase. Measuring them takes a few hundred decodes, tens of
seconds on a busy machine (docs/bench/calibration.md#calibration-budget), so:

- measurement (all of it in localspec/tuning/costs.py) is done most useful first: the target's step per thread count,
  the drafter's, v(γ) and c at the chosen counts, prompt evaluation per count, flash attention on/off; a stage
  that cannot finish before `budget_s` is dropped (the budget is overrun by at most one decode), except v(γ)
  when the controller drafts adaptively: it is timed in full however long that takes (once: the
  entry is cached), because every decision rests on it;
- a target's own MTP head (backend/mtp.py) is a drafter without a file of its own: its c is timed with v(γ) and
  cached with the target's entry, as a model drafter's is; so is an EAGLE-3 drafter file's (backend/eagle3.py,
  which runs beside the target as a head does: its c under "eagle3", its file in the entry's key);
- the result is cached per model file (path, size, mtime) + machine (CPU model, cores) + build (llama.cpp
  version and CPU features, OpenMP settings) + the load options that change costs, so the next start measures
  nothing;
- a cache entry cut short by the budget is completed at the next start (only what it lacks is measured);
- an entry remembers how busy the machine was while it measured (`others`: cores other programs used, from
  the CPU meter). One measured on a busy machine (others at or above ThreadControl.BUSY_AT) is provisional:
  its step times per thread count say "1 thread" and would keep an idle machine at half speed, and its v(γ),
  timed beside other programs, can be so high that speculation never starts and so never corrects it (a
  compile gave Gemma-3-270M v(4) 5.8, quiet 3.9). So the next start that is not busy measures it again; a busy
  start keeps it (the thread controller drops to the free cores at its first meter reading). Anything else
  stale is corrected online by the controllers, which start from these priors and follow what the rounds
  measure (and, while speculation is off, by the controller's probes).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable, Mapping, TypeVar

from ..backend import Model, build_info
from ..backend.machine import cpu_count, cpu_model, free_cores, openmp_settings
from ..lifecycle import remove_stale, temp_name
from ..models.paths import calibration_dir
from .acceptance import file_id
from .costs import Costs, Deadline, OutOfTime, flash_attn_times, measure, probe_tokens, thread_times
from .threads import ThreadControl, candidates, preferred

if TYPE_CHECKING:
    from ..backend.mtp import TimedHead

SCHEMA = 5  # raised whenever how an entry is measured changes, so older entries are measured again
# (the versions: docs/bench/calibration.md#cache-schema)
CONTEXT = 16  # tokens before the probe position (thread counts, flash attention)
# v(γ) is timed this deep: the prompts speculation pays on are hundreds of tokens, and a verify batch's attention
# grows with them; not deeper, because a first start pays the prefill (docs/bench/calibration.md#v-depth)
V_DEPTH = 128
PROMPT_CHUNK = 32  # tokens per prompt-evaluation timing
MIN_LEFT = 0.1  # a later stage starts only with this share of the budget left
MTP = "mtp"  # the MTP head's source name (speculative/mtp.py), its key in Costs.c
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Calibration:
    costs: Costs | None  # v(γ), t1, c ("model" for a model drafter, MTP for the target's head, "eagle3" for an
    # EAGLE-3 drafter file); None if the budget ran out before it
    threads: dict[str, dict[int, float]] = field(default_factory=dict)  # phase -> threads -> seconds per unit
    flash_attn: bool | None = None  # None: not measured (llama.cpp's auto)
    complete: bool = True  # False: the budget cut it short
    seconds: float = 0.0  # time spent measuring
    cached: bool = False  # read from the cache (nothing measured this start)
    others: float | None = None  # cores other programs used while it measured (CPU meter); None = unknown

    @property
    def v(self) -> tuple[float, ...]:
        return self.costs.v if self.costs else ()

    def to_dict(self) -> dict:
        return {"costs": self.costs.to_dict() if self.costs else None, "flash_attn": self.flash_attn,
                "threads": {p: {str(n): s for n, s in d.items()} for p, d in self.threads.items()},
                "complete": self.complete, "seconds": round(self.seconds, 3), "cached": self.cached,
                "others": None if self.others is None else round(self.others, 3)}

    @classmethod
    def from_dict(cls, d: Mapping, *, cached: bool = False) -> "Calibration":
        return cls(Costs.from_dict(d["costs"]) if d.get("costs") else None,
                   {p: {int(n): float(s) for n, s in t.items()} for p, t in d.get("threads", {}).items()},
                   d.get("flash_attn"), bool(d.get("complete")), float(d.get("seconds", 0.0)), cached,
                   None if d.get("others") is None else float(d["others"]))

    @property
    def provisional(self) -> bool:
        """Measured while other programs used the machine: kept only until a start that is not busy."""
        return self.others is not None and self.others >= ThreadControl.BUSY_AT

    def measured_busier(self, others_now: float | None) -> bool:
        """It is provisional and this start is not busy: measure it again."""
        return self.provisional and others_now is not None and others_now < ThreadControl.BUSY_AT


def _best(times: Mapping[K, float]) -> K | None:
    return min(times, key=times.__getitem__) if times else None


def measure_calibration(target: Model, *, k_max: int, draft_model: Model | None = None, budget_s: float = 2.0,
                        cores: int | None = None, counts: list[int] | None = None, flash_attn: bool = True,
                        repeats: int = 2, have: Calibration | None = None,
                        head: TimedHead | None = None) -> Calibration:
    """Measure what a start needs, most useful first, within `budget_s`. Stages `have` (an earlier partial
    entry) holds are skipped. The first stage measured always finishes (so every start makes progress and a
    budget too short for everything still completes over a few starts); a later stage that cannot finish one
    timed repeat before the deadline is dropped, so the budget is overrun by at most one decode. The caches
    are left as found (flash attention needs them empty and leaves the faster setting)."""
    t0 = time.perf_counter()
    counts = counts or candidates(cores or cpu_count())
    for model in (target, draft_model):  # the prefills between timings too: never above the counts timed
        if model is not None:
            model.set_threads(max(counts), max(counts))
    toks = probe_tokens(target, max(V_DEPTH + k_max + 1, PROMPT_CHUNK + 1))
    threads = {p: dict(d) for p, d in (have.threads if have else {}).items()}
    run = _Stages(t0, budget_s, toks, counts, repeats, threads)
    costs, fa = (have.costs, have.flash_attn) if have else (None, None)
    run.per_count(target, "target", toks[CONTEXT:CONTEXT + 1], 1)
    if draft_model is not None:
        run.per_count(draft_model, "draft", toks[CONTEXT:CONTEXT + 1], 1)
    if costs is None:
        costs = _measure_costs(run, target, draft_model, k_max)
    if costs is not None and head is not None and head.source not in costs.c:
        costs = _with_head_cost(run, costs, head, must=k_max > 0)
    run.per_count(target, "prompt", toks[:PROMPT_CHUNK], 0)
    if flash_attn and fa is None and target.n_past == 0:
        fa = _best(run.stage(lambda d: flash_attn_times(target, toks[:CONTEXT + 1], repeats=repeats, deadline=d))
                   or {})
    phases = {"target", "prompt"} | ({"draft"} if draft_model is not None else set())
    complete = costs is not None and phases <= set(run.threads) and (fa is not None or not flash_attn) \
        and (head is None or head.source in costs.c)
    return Calibration(costs, run.threads, fa, complete, time.perf_counter() - t0)


def _measure_costs(run: "_Stages", target: Model, draft_model: Model | None, k_max: int) -> Costs | None:
    """v(γ), t1 and c. Timed in full when the controller drafts, whatever the budget: every one of its decisions
    rests on v, and a budgeted stage was dropped or cut short (docs/bench/calibration.md#calibration-budget)."""
    drafters = {"model": draft_model} if draft_model is not None else None
    depth = max(0, min(V_DEPTH, target.n_ctx - target.n_past - k_max - 2))  # a small context: shallower
    must = k_max > 0
    return run.stage(lambda d: measure(target, run.toks[:depth + k_max + 1], k_max, repeats=run.repeats,
                                       deadline=None if must else d, drafters=drafters), must=must)


def _with_head_cost(run: "_Stages", costs: Costs, head: TimedHead, *, must: bool) -> Costs:
    """`costs` with the head's c under its source (the MTP head's or an EAGLE-3 drafter's: a head step ÷ a target
    row, backend/mtp.py's `measure_cost`), timed from an empty cache and left empty; unchanged when the target
    holds tokens or the stage is not run."""
    from ..backend.mtp import measure_cost

    target = head.target
    if target.n_past != 0:
        return costs

    def timed(_: Deadline) -> float | None:
        try:
            return measure_cost(head)
        finally:
            target.rewind(0)

    c = run.stage(timed, must=must)
    return replace(costs, c={**costs.c, head.source: c}) if c is not None else costs


class _Stages:
    """One measurement's stages sharing one budget, and the step times per thread count found so far. The
    first stage run (and one that must run) finishes one timed repeat whatever the budget, so every start
    makes progress; a later one starts only with MIN_LEFT of the budget left, else its time would be lost."""

    def __init__(self, t0: float, budget_s: float, toks: list[int], counts: list[int], repeats: int,
                 threads: dict[str, dict[int, float]]) -> None:
        self.budget_s, self.toks, self.counts, self.repeats, self.threads = budget_s, toks, counts, repeats, threads
        self.soft, self.hard = Deadline(t0 + budget_s), Deadline(t0 + budget_s, hard=True)
        self.first = True

    def stage(self, fn: Callable[[Deadline], T], must: bool = False) -> T | None:
        """Run one stage within the budget; None when it was not run or ran out of time."""
        sure = self.first or must
        if not sure and time.perf_counter() > self.hard.at - MIN_LEFT * self.budget_s:
            return None  # too little left to finish one: it would be dropped past the deadline, its time lost
        try:
            return fn(self.soft if sure else self.hard)
        except OutOfTime:
            return None
        finally:
            self.first = False

    def per_count(self, model: Model, phase: str, tokens: list[int], rows: int) -> None:
        """Time `phase` at each thread count (unless an earlier entry has it), then set `model` to the fastest
        count before the next stage (the prompt phase's times are only recorded)."""
        if phase not in self.threads and (times := self.stage(lambda d: self._times(model, tokens, rows, d))):
            self.threads[phase] = times
        n = preferred(self.threads[phase]) if phase in self.threads and phase != "prompt" else None
        if n is not None:
            model.set_threads(n, n)

    def _times(self, model: Model, tokens: list[int], rows: int, deadline: Deadline) -> dict[int, float]:
        base = model.n_past
        try:
            model.decode(self.toks[:CONTEXT], 0)
            return thread_times(model, self.counts, tokens, rows=rows, repeats=self.repeats, deadline=deadline)
        finally:
            model.rewind(base)


# -- the cache ------------------------------------------------------------------------------------------------

def cache_key(target: Model, draft_model: Model | None, k_max: int, cores: int,
              head: TimedHead | None = None) -> dict:
    """Everything a calibration depends on: the files, the machine, the build, the options that change costs (and,
    with the target's MTP head drafting, its head count; with an EAGLE-3 drafter file, that file: an entry made
    without the head lacks its c)."""
    o = target.options
    heads = _head_key(head)
    return heads | {"schema": SCHEMA, "target": file_id(target.path),
            "draft": file_id(draft_model.path) if draft_model is not None else None,
            "draft_ngl": draft_model.options.n_gpu_layers if draft_model is not None else None,
            "k_max": k_max, "cpu": cpu_model(), "cores": cores, "build": build_info(), "openmp": openmp_settings(),
            "ngl": o.n_gpu_layers, "type_k": o.type_k, "type_v": o.type_v, "rpc": list(o.rpc_servers),
            "n_batch": o.n_batch, "weights": target.weights, "fast_path": target.fast_path.mode}


def _head_key(head: TimedHead | None) -> dict:
    """What a drafting head adds to the cache key: the MTP heads' count (as entries made so far have it), or the
    drafter file's identity under its source."""
    if head is None:
        return {}
    if head.file is None:
        return {MTP: head.n_heads}
    return {head.source: file_id(head.file)}


def cache_path(key: Mapping) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return calibration_dir() / f"{digest}.json"


def read_cached(key: Mapping) -> Calibration | None:
    p = cache_path(key)
    try:
        d = json.loads(p.read_text())
        return Calibration.from_dict(d["calibration"], cached=True) if d.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: measure again


def write_cached(key: Mapping, cal: Calibration) -> None:
    p = cache_path(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(p)  # NAME.PID.tmp: one a killed writer left is removed at a later start
        tmp.write_text(json.dumps({"key": key, "calibration": cal.to_dict()}, indent=1))
        tmp.replace(p)
    except OSError:
        pass  # a read-only cache only costs the next start its calibration


def calibrate(target: Model, *, k_max: int, draft_model: Model | None = None, budget_s: float = 2.0,
              use_cache: bool = True, cores: int | None = None, threads: int | None = None,
              others: Callable[[], float | None] | None = None, head: TimedHead | None = None) -> Calibration:
    """The cached calibration when there is a complete one (its flash-attention choice applied), else measure
    what the cache entry lacks within `budget_s` and cache the result. `threads` (pinned): measure at that
    count only. `others` reads how many cores other programs use now (the CPU meter): an entry whose thread
    times came from a busy machine is measured again on a quiet one. Flash attention the user set
    (`target.options.flash_attn` not None) is neither measured nor changed. `head`: the target's MTP head or an
    EAGLE-3 drafter file, which drafts: its c is measured and cached too."""
    cores = cores or cpu_count()
    user_fa = target.options.flash_attn
    key = cache_key(target, draft_model, k_max, cores, head) | {"pinned": threads, "flash_attn": user_fa} \
        if use_cache else None
    old = read_cached(key) if key else None
    if key and old is None:
        remove_stale(calibration_dir())
    now = others() if others else None
    if old is not None and old.measured_busier(now):
        old = replace(old, costs=None, threads={}, complete=False)  # keep flash attention; time the rest again
    if old is not None and old.flash_attn is not None and user_fa is None and target.n_past == 0:
        target.set_flash_attn(old.flash_attn)
    if old is not None and old.complete:
        _apply_threads(target, draft_model, old)
        return old
    cal = measure_calibration(target, k_max=k_max, draft_model=draft_model, budget_s=budget_s, cores=cores,
                              counts=[threads] if threads else _counts_now(cores, now), have=old,
                              flash_attn=user_fa is None, head=head)
    cal = replace(cal, others=others() if others else None)
    if key:
        write_cached(key, cal)
    _apply_threads(target, draft_model, cal)
    return cal


def _counts_now(cores: int, others: float | None) -> list[int] | None:
    """The thread counts to time: all candidates (None), but on a busy machine none above its free cores. A
    decode at 2 threads among two CPU-bound neighbours on 2 cores waits at every barrier for a preempted thread
    (docs/bench/calibration.md#calibration-budget), so timing it would make a busy first start slow; the thread
    controller never uses more than the free cores there either, and a quiet start times the rest
    (`measured_busier`)."""
    if others is None or others < ThreadControl.BUSY_AT:
        return None
    return [n for n in candidates(cores) if n <= free_cores(cores, others)]


def _apply_threads(target: Model, draft_model: Model | None, cal: Calibration) -> None:
    """Start each model at its fastest measured count (the thread controller takes over from there)."""
    for model, phase in ((target, "target"), (draft_model, "draft")):
        n = preferred(cal.threads.get(phase, {}))
        if model is not None and n:
            model.set_threads(n, n)


