"""The option blocks the model commands share, each declared once and handed to the command as ONE value.

    @engine_options    --model/--pair/--draft/--lookup/--no-spec/-k/--ctx/--models-dir/..., offload, adaptive
                       -> engine_config: EngineConfig
    @sampling_options  --temp/--top-k/--top-p/--min-p/--repeat-penalty/--repeat-last-n/--seed -> params
    @metrics_options   --metrics-log/--task -> metrics_log: MetricsLog | None, task: str | None

A command declares only the blocks it reads (serve has no sampling or metrics options). `--pair` is resolved
here, once, for every command (bench reads `pair_models` for its own repeatable --pair).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import click

# llama-server / Ollama defaults for chat (llama-server: top_p 0.95, Ollama: 0.9; both min_p 0.05, top_k 40,
# repeat_last_n 64; Ollama repeat_penalty 1.1). Plain `run` without --chat stays greedy.
CHAT_SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, repeat_last_n=64)
PLAIN_SAMPLING = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, repeat_last_n=64)
K_HELP = ("Pin the draft length γ to N. Default: adaptive, γ chosen each round between --k-min and --k-max "
          "(with --no-adaptive: the pair's k from models.toml, else 4). For no drafting use --no-spec.")
NO_DRAFT_HINT = "use --no-spec for no drafting"


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan and inf (nan passes every range comparison)."""

    name = "float"

    def convert(self, value: Any, param, ctx) -> float:
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


class DraftLength(click.IntRange):
    """γ in 1..64; 0 is refused with the option that means "no drafting"."""

    def __init__(self) -> None:
        super().__init__(1, 64)

    def convert(self, value: Any, param, ctx) -> int:
        if str(value).strip() == "0":
            self.fail(f"0 drafts nothing: {NO_DRAFT_HINT}", param, ctx)
        return super().convert(value, param, ctx)


def bundle(options: list[Callable], build: Callable[[dict, dict], dict]) -> Callable[[Callable], Callable]:
    """A decorator: declare `options`; at call time their values become `build(values, other_arguments)`, the new
    keyword arguments of the command (one value per block, e.g. `engine_config`)."""

    def decorate(f: Callable) -> Callable:
        existing = {id(p) for p in getattr(f, "__click_params__", ())}
        names: list[str] = []

        @functools.wraps(f)
        def wrapper(*args, **kw):
            values = {n: kw.pop(n) for n in names}
            return f(*args, **kw, **build(values, kw))

        decorated: Callable = wrapper
        for o in reversed(options):
            decorated = o(decorated)
        names.extend(p.name for p in getattr(decorated, "__click_params__", ()) if id(p) not in existing)
        return decorated

    return decorate


# -- engine ------------------------------------------------------------------------------------------------------

_CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]

_ENGINE = [
    click.option("--model", "-m", metavar="NAME|PATH", help="Target model: a models.toml name or a .gguf path "
                 "(default: the embedded SmolLM2-135M, a demo-sized model)."),
    click.option("--pair", metavar="NAME", help="A models.toml pair ([pairs.NAME]): its target and drafter "
                 "(--draft/--lookup/--no-spec still choose the drafter)."),
    click.option("--draft", metavar="NAME|PATH|auto|self", help="Drafter model with the same tokenizer; 'auto': "
                 "the fastest predicted local GGUF with it (none: prompt lookup); 'self': the target's low-bit copy "
                 "('localspec models make-drafter')."),
    click.option("--models-dir", "models_dirs", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
                 help="A folder of GGUFs to search for models and drafters (repeatable; LOCALSPEC_MODELS_DIR too), "
                 "besides models.toml and the Hugging Face cache."),
    click.option("--lookup", is_flag=True, help="Draft by prompt lookup (n-grams from the context)."),
    click.option("--no-spec", is_flag=True, help="Plain decoding, no speculation."),
    click.option("-k", "k", type=DraftLength(), metavar="N", help=K_HELP),
    click.option("--ctx", "n_ctx", type=click.IntRange(16), help="Context length in tokens (default: the model's "
                 "n_ctx in models.toml, else 4096; at most the model's trained context)."),
    click.option("--ngl", type=int, help="Target layers to offload to the GPU (-1 = all; default: the model's "
                 "n_gpu_layers in models.toml, else 0)."),
    click.option("--ngl-draft", type=int, help="Drafter layers to offload (default: same as --ngl)."),
    click.option("--threads", "-t", type=click.IntRange(1, 1024), help="Pin CPU threads to N for every phase "
                 "(default: chosen at run time per model and phase)."),
    click.option("--verbose", is_flag=True, help="Show llama.cpp's load log (offload, buffers)."),
    # GPU offload / RPC (docs/models.md)
    click.option("--main-gpu", type=click.IntRange(0), default=0, help="GPU for the whole model or its small "
                 "tensors when split (default 0)."),
    click.option("--tensor-split", metavar="P0,P1,..", help="Split layers over GPUs (and RPC devices) in these "
                 "proportions, e.g. 3,1."),
    click.option("--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto", help="Flash attention."),
    click.option("--mmap/--no-mmap", "mmap", default=None, help="Map the model file (llama.cpp's default: loads "
                 "faster, decodes a few % slower) or read it into memory backed by huge pages (default on Linux "
                 "for a model on the CPU that is small next to free memory)."),
    click.option("--repack/--no-repack", "repack", default=None, help="Use llama.cpp's extra CPU buffer types "
                 "(AMX, repacked weights) or none (llama.cpp's --no-repack). Default: the fastest whose logits "
                 "match plain llama.cpp's in a trial, run once per model, CPU and build."),
    click.option("--cache-type-k", type=click.Choice(_CACHE_TYPES), help="KV cache type for K (default f16)."),
    click.option("--cache-type-v", type=click.Choice(_CACHE_TYPES), help="KV cache type for V (default f16; "
                 "quantized V needs --flash-attn on)."),
    click.option("--rpc", metavar="HOST:PORT,..", help="llama.cpp ggml-rpc-server devices to put the model's "
                 "layers on, before local GPUs (needs a GGML_RPC=on build; see docs/models.md)."),
    # adaptive speculation
    click.option("--no-adaptive", is_flag=True, help="Fixed draft length; speculation never switched off "
                 "(for measurements)."),
    click.option("--k-min", type=click.IntRange(1, 64), default=1, show_default=True,
                 help="Shortest draft the adaptive controller may choose."),
    click.option("--k-max", type=click.IntRange(1, 64), default=8, show_default=True,
                 help="Longest draft the adaptive controller may choose."),
    click.option("--hybrid", is_flag=True, help="Prompt lookup first, the --draft model (or mtp: the file's own "
                 "heads) when lookup has no match (same as --draft NAME --lookup)."),
    click.option("--draft-p-min", type=Finite(0, 1), default=0.0, help="Model drafter stops once its top "
                 "probability falls below this (default 0 = never)."),
    click.option("--structure/--no-structure", default=False, help="Draft the text a request's grammar or JSON "
                 "schema forces (keys, punctuation, a tool's name) before the drafter; lossless; off by default "
                 "(docs/bench/structure.md#structure-drafting)."),
]


def _tensor_split(text: str | None) -> tuple[float, ...] | None:
    if not text:
        return None
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 3,1, got {text!r}",
                                 param_hint="--tensor-split") from None
    if any(not math.isfinite(x) or x < 0 for x in parts) or not any(parts):
        raise click.BadParameter("proportions must be finite, >= 0 and not all 0", param_hint="--tensor-split")
    return parts


def _load_options(v: dict):
    """LoadOptions from the offload options."""
    import gguf

    from ..backend import LoadOptions

    def ggml_type(name: str | None) -> int | None:
        return gguf.GGMLQuantizationType[name.upper()].value if name else None

    rpc = tuple(x.strip() for x in (v["rpc"] or "").split(",") if x.strip())
    return LoadOptions(main_gpu=v["main_gpu"] or 0, tensor_split=_tensor_split(v["tensor_split"]),
                       flash_attn={"on": True, "off": False}.get(v["flash_attn"] or "auto"),
                       type_k=ggml_type(v["cache_type_k"]), type_v=ggml_type(v["cache_type_v"]), rpc_servers=rpc,
                       mmap=v["mmap"], fast_path={True: "all", False: "none"}.get(v["repack"]))


def pair_models(name: str):
    """A models.toml pair by name (the one lookup every command uses); unknown -> one line listing the pairs."""
    from ..errors import ModelNotFound
    from ..models.registry import load_registry

    pairs = load_registry().pairs
    p = pairs.get(name)
    if p is None:
        raise ModelNotFound(f"no pair named {name!r} in models.toml; known pairs: {', '.join(sorted(pairs)) or 'none'}"
                            " ('localspec models list' shows them)")
    return p


def _drafter_choice(v: dict) -> tuple[str | None, str | None, bool]:
    """(model, draft, hybrid) from --model/--pair/--draft/--lookup/--no-spec/--hybrid, with the pair resolved."""
    from ..models import LOOKUP
    from ..speculative.types import NO_DRAFTER

    model, draft, lookup, no_spec = v["model"], v["draft"], v["lookup"], v["no_spec"]
    if v["pair"]:
        if model:
            raise click.UsageError("choose one of --model and --pair (a pair names its target)")
        p = pair_models(v["pair"])
        model = p.target
        if not (draft or lookup or no_spec):  # the pair's drafter unless one was chosen
            draft, lookup = (None, True) if p.drafter == LOOKUP else (p.drafter, False)
    hybrid = v["hybrid"] or bool(draft and lookup)  # --draft NAME --lookup: lookup first, then the model
    if hybrid and not draft:
        raise click.UsageError("--hybrid needs a drafter model: add --draft NAME|PATH|mtp")
    if sum(bool(x) for x in (draft, lookup, no_spec)) > 1 and not (hybrid and not no_spec):
        raise click.UsageError("choose one of --draft, --lookup, --no-spec (--draft with --lookup = hybrid)")
    return model, draft or (LOOKUP if lookup else NO_DRAFTER if no_spec else None), hybrid


def engine_config_from(v: dict):
    """The values of the engine options -> one EngineConfig (raises click usage errors for contradictions)."""
    from ..engine.loader import EngineConfig

    if v["k_min"] > v["k_max"]:
        raise click.UsageError(f"--k-min {v['k_min']} is above --k-max {v['k_max']}")
    model, draft, hybrid = _drafter_choice(v)
    return EngineConfig(model=model, draft=draft, k=v["k"], n_ctx=v["n_ctx"], threads=v["threads"], ngl=v["ngl"],
                      ngl_draft=v["ngl_draft"], verbose=v["verbose"], load=_load_options(v),
                      adaptive=not v["no_adaptive"], k_min=v["k_min"], k_max=v["k_max"], hybrid=hybrid,
                      p_min=v["draft_p_min"], models_dirs=tuple(v["models_dirs"]),
                      structure=v["structure"])


engine_options = bundle(_ENGINE, lambda v, _rest: {"engine_config": engine_config_from(v)})


# -- sampling ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingDefaults:
    """Which defaults a command's sampling options fall back to: chat-like always, or only with its --chat flag."""

    chat: bool = False  # chat-like defaults always (the chat TUI)
    chat_flag: str | None = None  # or: chat-like when this boolean parameter of the command is set (run --chat)

    def doc(self, key: str) -> str:
        plain, chat = PLAIN_SAMPLING[key], CHAT_SAMPLING[key]
        if self.chat:
            return f"default {chat:g}"
        if self.chat_flag and plain != chat:
            return f"default {plain:g}; with --{self.chat_flag} {chat:g}"
        return f"default {plain:g}"


def _sampling_block(d: SamplingDefaults) -> list[Callable]:
    return [
        click.option("--temp", type=Finite(0), help=f"Temperature, 0 = greedy ({d.doc('temperature')})."),
        click.option("--top-k", type=click.IntRange(0), help=f"Top-k, 0 = off ({d.doc('top_k')})."),
        click.option("--top-p", type=Finite(0, 1, min_open=True), help=f"Top-p, 1 = off ({d.doc('top_p')})."),
        click.option("--min-p", type=Finite(0, 1), help=f"Min-p, 0 = off ({d.doc('min_p')})."),
        click.option("--repeat-penalty", type=Finite(0, min_open=True), help="Penalise tokens seen in the last "
                     f"--repeat-last-n tokens, 1 = off ({d.doc('repeat_penalty')})."),
        click.option("--repeat-last-n", type=click.IntRange(-1), help="Tokens the repeat penalty looks back over, "
                     f"0 = off, -1 = all ({d.doc('repeat_last_n')})."),
        click.option("--seed", type=click.IntRange(0), help="Random seed for sampling (default: random)."),
    ]


_PARAM_OF = {"temp": "temperature"}


def sampling_options(*, chat: bool = False, chat_flag: str | None = None) -> Callable[[Callable], Callable]:
    """Sampling options -> `params: SamplingParams`; unset options take the plain or chat-like defaults
    (chat-like always with chat=True, or when the command's own `chat_flag` parameter is set)."""
    d = SamplingDefaults(chat=chat, chat_flag=chat_flag)

    def build(v: dict, rest: dict) -> dict:
        from ..sampling.params import SamplingParams

        chatty = chat or bool(chat_flag and rest.get(chat_flag))
        given = {_PARAM_OF.get(k, k): x for k, x in v.items() if x is not None}
        return {"params": SamplingParams(**{**(CHAT_SAMPLING if chatty else PLAIN_SAMPLING), **given})}

    return bundle(_sampling_block(d), build)


# -- acceptance log ----------------------------------------------------------------------------------------------

_METRICS = [
    click.option("--metrics-log", type=click.Path(dir_okay=False), metavar="FILE", help="Append one JSON line per "
                 "request (acceptance, k chosen, tok/s) to FILE."),
    click.option("--task", metavar="LABEL", help="Task label recorded in the --metrics-log line."),
]


def _metrics(v: dict, _rest: dict) -> dict:
    from ..engine.metrics import MetricsLog

    try:
        log = MetricsLog(v["metrics_log"]) if v["metrics_log"] else None
    except OSError as e:
        raise click.BadParameter(f"cannot write {v['metrics_log']}: {e.strerror or e} ({e.filename})",
                                 param_hint="--metrics-log") from None
    return {"metrics_log": log, "task": v["task"]}


metrics_options = bundle(_METRICS, _metrics)
