"""Run the bench: plain decoding and every speculative configuration on the same prompts, interleaved.

One loaded target per model is shared by all its configurations (plain, prompt lookup, each model drafter, the
file's own MTP heads, each k), so they differ only in the drafter and k. Every configuration's Engine comes from
the loader's `assemble`, the way `run`, `chat` and `serve` build theirs: a k row is that engine with γ pinned
(FixedK), and the "auto" row is the shipped default (adaptive, the default k range, the drafter's priors, the lookup's
SuffixCache, the load-time calibration). Configurations are interleaved prompt by prompt, in an order
rotated per prompt, to cancel machine drift; every run starts from an empty KV cache so TTFT includes the
prompt. A short warm-up runs every configuration once before anything is timed. Costs (c, v(γ)) are measured
after the warm-up and again at the end, and averaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from ..backend import LoadOptions, Model
from ..backend.machine import CpuMeter
from ..engine.engine import Engine
from ..engine.loader import EngineConfig, assemble, check_drafter, eagle3_drafters, make_eagle3, make_mtp
from ..models import LOOKUP
from ..sampling.params import SamplingParams
from ..speculative.drafters import PromptLookup
from ..speculative.mtp import MTP, MtpDrafter
from ..speculative.structure import STRUCTURE, StructureDrafter
from ..speculative.suffix import SuffixCache
from ..speculative.types import NO_DRAFTER, Drafter
from ..tuning.costs import Costs, measure, merge
from .agreement import Agreement, compare
from .tasks import Prompt, constrained

AUTO = "auto"
# the report's v(γ) reaches the default adaptive range (a model drafter's auto row; lookup's may draft longer, on
# its own calibration): the table's predicted best k is chosen from it
REPORT_K_MAX = EngineConfig.k_max
PLAIN = NO_DRAFTER  # the plain-decoding configuration
STRUCTURE_LOOKUP = f"{STRUCTURE}+{LOOKUP}"  # the structure drafter with prompt lookup where nothing is forced


@dataclass(frozen=True)
class TargetSpec:
    label: str
    path: Path
    drafters: tuple[tuple[str, Path], ...] = ()  # (label, path) of model drafters for this target
    lookup: bool = True
    mtp: bool = False  # rows for the file's own MTP heads (`bench --draft mtp`), labelled MTP as `run` labels them


@dataclass(frozen=True)
class Plan:
    targets: tuple[TargetSpec, ...]
    prompts: tuple[Prompt, ...]
    ks: tuple[int, ...] = (2, 4)
    auto: bool = False  # also run the adaptive controller
    temps: tuple[float, ...] = (0.0,)
    repeats: int = 1
    max_tokens: int = 128
    n_ctx: int = 2048
    threads: int | None = None
    seed: int = 1234
    busy: int = 0  # CPU-bound background processes during the run (bench --busy N)
    cost_repeats: int = 7
    repeat_penalty: float = 1.0  # applied alike to every configuration (plain and speculative)
    repeat_last_n: int = 64
    fast_path: str | None = None  # llama.cpp's extra CPU buffer types (--repack/--no-repack); None: tested


@dataclass(frozen=True)
class Config:
    drafter: str  # PLAIN, "lookup", MTP (the target's own heads), or a model drafter's label
    k: int | str  # 0 for plain, an int, or AUTO

    @property
    def name(self) -> str:
        return "plain" if self.drafter == PLAIN else f"{self.drafter} k={self.k}"


@dataclass(frozen=True)
class Run:
    """One measured generation."""

    target: str
    drafter: str
    k: int | str
    task: str
    prompt_id: str
    temp: float
    repeat: int
    n_prompt: int
    n_generated: int
    gen_ms: float
    ttft_ms: float
    rounds: int
    draft_n: int
    draft_n_accepted: int
    draft_ms: float
    drafted_at: tuple[int, ...]
    accepted_at: tuple[int, ...]
    accept_hist: tuple[int, ...]  # rounds with a draft, by number of drafts accepted (index 0..k)
    finish: str | None
    first_ms: float = 0.0  # the first round (in TTFT; for a model drafter it includes its prompt prefill)
    first_tokens: int = 0
    tokens: tuple[int, ...] = field(repr=False, default=())
    threads: int = 0  # the target's thread count at the end of the run (chosen at run time unless --threads)

    @property
    def config(self) -> Config:
        return Config(self.drafter, self.k)


@dataclass(frozen=True)
class TargetResult:
    label: str
    path: str
    n_params_desc: str
    costs: Costs
    runs: tuple[Run, ...]
    agreement: tuple[Agreement, ...]
    chat_template: bool


def configs_for(target: TargetSpec, plan: Plan) -> list[Config]:
    ks: list[int | str] = list(plan.ks) + ([AUTO] if plan.auto else [])
    drafters = [LOOKUP] if target.lookup else []
    drafters += ([MTP] if target.mtp else []) + [label for label, _ in target.drafters]
    if any(p.schema for p in plan.prompts):  # a grammar to draft from: structure alone and with lookup
        drafters += [STRUCTURE] + ([STRUCTURE_LOOKUP] if target.lookup else [])
    return [Config(PLAIN, 0)] + [Config(d, k) for d in drafters for k in ks]


def row_config(cfg: Config, plan: Plan) -> EngineConfig:
    """What a row runs, said as `run` would be told it: no drafter, a drafter with γ pinned (`--k N
    --no-adaptive`), or AUTO: the drafter with every other option at the default `run` ships."""
    if cfg.drafter == PLAIN:
        return EngineConfig(draft=NO_DRAFTER, threads=plan.threads)
    structure = cfg.drafter in (STRUCTURE, STRUCTURE_LOOKUP)  # EngineConfig.structure, alone or over lookup
    draft = {STRUCTURE: NO_DRAFTER, STRUCTURE_LOOKUP: LOOKUP}.get(cfg.drafter, cfg.drafter)
    if cfg.k == AUTO:
        return EngineConfig(draft=draft, threads=plan.threads, structure=structure)
    return EngineConfig(draft=draft, k=int(cfg.k), adaptive=False, threads=plan.threads, structure=structure)


def count_runs(plan: Plan) -> int:
    per_prompt = len(plan.temps) * plan.repeats
    return sum(len(configs_for(t, plan)) * per_prompt * len(plan.prompts) for t in plan.targets)


def render_prompt(engine: Engine, p: Prompt) -> list[int]:
    """Chat prompts go through the GGUF chat template when the model has one; base models get raw text."""
    text = engine.chat_prompt([{"role": "user", "content": p.prompt}]) if p.chat and engine.chat_template \
        else p.prompt
    return engine.tokenize(text)


class Family:
    """One loaded target and its drafter models, and an Engine per configuration over them, all sharing the
    target Model (no file is loaded twice). With MTP rows the target is loaded with its heads for every row (plain
    too: its decodes then also keep each row's hidden state for the head), and the rows share one head drafter.
    An EAGLE-3 drafter file is no model of its own: it runs beside the target as `run` runs it (`make_eagle3`),
    its rows labelled with the file's name share it, and the target's decodes keep its three layers' rows for
    every row. A target reports its decodes to one reader, so it has MTP rows or one EAGLE-3 file, not both."""

    def __init__(self, target: TargetSpec, plan: Plan) -> None:
        for label, path in target.drafters:
            check_drafter(target.path, path, target_name=target.label, drafter_name=label)
        eagle3 = eagle3_drafters(target.label, target.drafters, mtp=target.mtp)
        meter = CpuMeter()  # as load_engine: started before the models load, shared by every row's controllers
        opts = LoadOptions(n_ctx=plan.n_ctx, n_threads=plan.threads, fast_path=plan.fast_path)
        self.models: list[Model] = []
        self.mtp: MtpDrafter | None = None  # the MTP rows' or the EAGLE-3 rows' drafter
        self.mtp_label = MTP if target.mtp else eagle3[0][0] if eagle3 else None  # the rows self.mtp drafts for
        try:
            self.target = self._load(target.path, replace(opts, mtp=target.mtp))
            self.draft_models = {label: self._load(path, opts) for label, path in target.drafters
                                 if (label, path) not in eagle3}
            self.mtp = make_mtp(self.target) if target.mtp else make_eagle3(self.target, eagle3[0][1]) \
                if eagle3 else None
            # each row calibrates as `run` would (cached per model, machine and k range: a first bench pays it)
            self.engines: dict[Config, Engine] = {
                cfg: assemble(row_config(cfg, plan), self.target, self.draft_models.get(cfg.drafter),
                              name=target.label, meter=meter, mtp=self.mtp if cfg.drafter == self.mtp_label else None)
                for cfg in configs_for(target, plan)}
        except BaseException:  # a failed load or Ctrl-C: free what is loaded
            self.close()
            raise

    @property
    def plain(self) -> Engine:
        return self.engines[Config(PLAIN, 0)]

    def _load(self, path: Path, opts: LoadOptions) -> Model:
        m = Model.load(path, opts)
        self.models.append(m)
        return m

    def reset(self) -> None:
        """Empty every KV cache, so each run pays for its prompt (fair TTFT across configurations), and what each
        prompt lookup kept of earlier runs (`forget_requests`)."""
        for m in self.models:
            m.rewind(0)
        for e in self.engines.values():
            forget_requests(e.drafter)

    def close(self) -> None:
        if self.mtp is not None:  # the head's context lives on the target's weights: freed first
            self.mtp.close()
        for m in self.models:
            m.close()


def forget_requests(drafter: Drafter | None) -> None:
    """Empty a prompt lookup's index and its SuffixCache. The shipped cache fills across requests, as in a server;
    the bench's runs are independent requests, and a repeat (or another temperature) of a prompt would find the
    previous run's answer there and copy it: memory, not speculation. So every run starts as a first request."""
    if isinstance(drafter, StructureDrafter):
        drafter = drafter.fallback
    if isinstance(drafter, PromptLookup):
        drafter.sync(())  # hands the index to the old cache, which is then dropped
        if drafter.cache is not None:
            drafter.cache = SuffixCache(drafter.cache.max_tokens, drafter.cache.min_doc)


def run_one(fam: Family, cfg: Config, tokens: list[int], params: SamplingParams, max_tokens: int,
            k_hist: int) -> tuple:
    """Generate once; returns the fields of `Run` that come from the generation."""
    fam.reset()
    engine = fam.engines[cfg]
    hist = [0] * (k_hist + 1)
    out: list[int] = []
    last = None
    first: tuple[float, int] | None = None
    for chunk in engine.generate(tokens, params=params, max_tokens=max_tokens, speculate=cfg.drafter != PLAIN):
        out.extend(chunk.step.tokens)
        if first is None:
            first = ((chunk.step.t_draft + chunk.step.t_verify) * 1e3, len(chunk.step.tokens))
        if chunk.step.drafted:
            a = chunk.step.accepted
            if a >= len(hist):
                hist.extend([0] * (a + 1 - len(hist)))
            hist[a] += 1
        last = chunk
    if last is None or first is None or engine.threads is None:  # every run yields a chunk; bench engines tune threads
        raise RuntimeError(f"{cfg}: the run ended without a chunk, or its engine has no thread control")
    s = last.stats
    return (s.n_prompt, s.n_generated, s.gen_ms, s.ttft_ms, s.rounds, s.draft_n, s.draft_n_accepted, s.draft_ms,
            s.drafted_at, s.accepted_at, tuple(hist), last.finish, *first, tuple(out), engine.threads.state().threads)


def _cost_context(fam: Family, prompts: Sequence[list[int]], need: int, n_ctx: int) -> list[int]:
    """The longest prompt (a realistic position), padded by repetition if it is too short for the largest γ."""
    ctx = max(prompts, key=len)
    while len(ctx) < need:
        ctx = ctx + ctx
    return ctx[: max(need, min(len(ctx), n_ctx // 2))]


def bench_target(target: TargetSpec, plan: Plan, progress: Callable[[str], None] = lambda s: None,
                 log: Callable[[str], None] = lambda s: None) -> TargetResult:
    log(f"bench: loading {target.label}; each configuration calibrates as `localspec run` does (cached)")
    fam = Family(target, plan)
    try:
        return _bench_family(fam, target, plan, progress, log)
    finally:
        fam.close()


def _bench_family(fam: Family, target: TargetSpec, plan: Plan, progress, log) -> TargetResult:
    plain = fam.plain
    cfgs = configs_for(target, plan)
    k_hist = max(plan.ks, default=8)
    rendered = {p.id: render_prompt(plain, p) for p in plan.prompts}
    room = plan.n_ctx - plan.max_tokens - k_hist - 2
    too_long = [pid for pid, t in rendered.items() if len(t) > room]
    if too_long:
        log(f"bench: skipping {len(too_long)} prompt(s) longer than the context allows ({', '.join(too_long)})")
    prompts = [p for p in plan.prompts if p.id not in too_long]

    log(f"bench: {target.label}: CPU fast paths {fam.target.fast_path.describe()}")
    if fam.mtp is not None and fam.mtp_label == MTP:
        log(f"bench: {target.label}: the mtp rows draft with the file's own MTP heads (no drafter model loaded)")
    elif fam.mtp is not None:
        log(f"bench: {target.label}: {fam.mtp_label} is an EAGLE-3 drafter: it runs beside the target, fed its "
            "hidden states (not loaded as a model)")
    log(f"bench: warming up {target.label} ({len(cfgs)} configurations)")
    for cfg in cfgs:
        run_one(fam, cfg, rendered[prompts[0].id], SamplingParams(), 8, k_hist)
    k_cost = max(max(plan.ks, default=1), REPORT_K_MAX)  # the report's costs: measurement, not a controller
    cost_ctx = _cost_context(fam, list(rendered.values()), k_cost + 2, plan.n_ctx)
    c_start = _measure(fam, cost_ctx, k_cost, target.lookup, plan.cost_repeats)

    runs: list[Run] = []
    try:
        _run_prompts(fam, target, plan, prompts, cfgs, rendered, k_hist, progress, runs)
    except KeyboardInterrupt:  # keep the finished runs: the caller writes a partial report
        raise Interrupted([TargetResult(target.label, str(target.path), fam.target.describe(), c_start, tuple(runs), (),
                                        bool(plain.chat_template))] if runs else []) from None

    costs = merge(c_start, _measure(fam, cost_ctx, k_cost, target.lookup, plan.cost_repeats))
    fam.reset()
    agree = tuple(compare(fam.target, rendered[r.prompt_id], base.tokens, r.tokens, label=target.label,
                          drafter=r.drafter, k=r.k, task=r.task, prompt_id=r.prompt_id)
                  for r, base in _greedy_pairs(runs))
    return TargetResult(target.label, str(target.path), fam.target.describe(), costs, tuple(runs), agree,
                        bool(plain.chat_template))


def _run_prompts(fam: Family, target: TargetSpec, plan: Plan, prompts, cfgs, rendered, k_hist: int, progress,
                 runs: list[Run]) -> None:
    """Every prompt × temperature × repeat × configuration, appended to `runs` as each finishes."""
    for i, p in enumerate(prompts):
        for temp in plan.temps:
            for rep in range(plan.repeats):
                params = SamplingParams(temperature=temp, seed=plan.seed + 1000 * i + rep,
                                        repeat_penalty=plan.repeat_penalty, repeat_last_n=plan.repeat_last_n)
                order = cfgs[i % len(cfgs):] + cfgs[:i % len(cfgs)]  # rotate: no config always runs first
                for cfg in order:
                    progress(f"{target.label} {p.id} {cfg.name} T={temp:g}")
                    r = run_one(fam, cfg, rendered[p.id], constrained(params, p, fam.target), plan.max_tokens,
                                k_hist)
                    runs.append(Run(target.label, cfg.drafter, cfg.k, p.task, p.id, temp, rep, *r))


def _measure(fam: Family, context: list[int], k_max: int, lookup: bool, repeats: int) -> Costs:
    """v(1..k_max) and c of every drafter, from an empty cache (a realistic position: the longest prompt); the
    MTP head's or EAGLE-3 drafter's c as the calibration times it (backend/mtp.py, `measure_cost`), under its rows'
    label."""
    fam.reset()
    costs = measure(fam.target, context, k_max, drafters=fam.draft_models, lookup=lookup, repeats=repeats)
    if fam.mtp is None or fam.mtp_label is None:
        return costs
    from ..backend.eagle3 import Eagle3Head
    from ..backend.mtp import MtpHead, measure_cost

    head = fam.mtp.head
    c = measure_cost(head) if isinstance(head, (MtpHead, Eagle3Head)) else None
    fam.reset()
    return replace(costs, c={**costs.c, fam.mtp_label: c}) if c is not None else costs


def _greedy_pairs(runs: Sequence[Run]):
    """(speculative run, plain run) on the same prompt, greedy, first repeat: texts that must agree."""
    plain = {(r.prompt_id, r.temp): r for r in runs if r.drafter == PLAIN and r.repeat == 0}
    for r in runs:
        if r.drafter != PLAIN and r.temp == 0.0 and r.repeat == 0 and (r.prompt_id, r.temp) in plain:
            yield r, plain[(r.prompt_id, r.temp)]


class Interrupted(Exception):
    """Ctrl-C during a bench: `results` holds every target's finished runs (agreement not computed)."""

    def __init__(self, results: list[TargetResult]) -> None:
        super().__init__("interrupted")
        self.results = results


def run_bench(plan: Plan, progress: Callable[[str], None] = lambda s: None,
              log: Callable[[str], None] = lambda s: None) -> list[TargetResult]:
    """Bench every target in turn; Ctrl-C raises `Interrupted` carrying the runs finished so far."""
    done: list[TargetResult] = []
    for t in plan.targets:
        try:
            done.append(bench_target(t, plan, progress, log))
        except Interrupted as e:
            raise Interrupted(done + e.results) from None
        except KeyboardInterrupt:  # while loading, warming up or measuring costs
            raise Interrupted(done) from None
    return done
