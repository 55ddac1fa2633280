"""Options every model-using command shares (run, chat, serve, bench) and the one way errors are shown."""

from __future__ import annotations

import functools
import sys
from typing import Callable

import click

from ..errors import LocalspecError


def engine_options(f: Callable) -> Callable:
    """--model/--draft/--lookup/--no-spec/-k/--ctx/--ngl/--ngl-draft/--threads/--verbose."""
    opts = [
        click.option("--model", "-m", metavar="NAME|PATH", help="Target model: a models.toml name or a .gguf path "
                     "(default: the embedded SmolLM2-135M)."),
        click.option("--draft", metavar="NAME|PATH", help="Drafter model with the same tokenizer."),
        click.option("--lookup", is_flag=True, help="Draft by prompt lookup (n-grams from the context)."),
        click.option("--no-spec", is_flag=True, help="Plain decoding, no speculation."),
        click.option("-k", "k", type=click.IntRange(1, 64), help="Draft length (default: the pair's, else 4)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(16), help="Context length in tokens."),
        click.option("--ngl", type=int, help="Target layers to offload to the GPU (-1 = all; default: the "
                     "model's n_gpu_layers in models.toml, else 0)."),
        click.option("--ngl-draft", type=int, help="Drafter layers to offload (default: same as --ngl)."),
        click.option("--threads", "-t", type=click.IntRange(1), help="CPU threads (default: all cores)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's load log (offload, buffers)."),
    ]
    for o in reversed(opts + _offload_options() + _adaptive_options()):
        f = o(f)
    return f


# -- GPU offload / RPC: stored in ctx.meta (expose_value=False) so commands need no new parameters ----------------

_META = "localspec.load"
_CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


def _remember(ctx: click.Context, param: click.Parameter, value):
    ctx.meta.setdefault(_META, {})[param.name] = value
    return value


def _tensor_split(text: str | None) -> tuple[float, ...] | None:
    if not text:
        return None
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 3,1, got {text!r}") from None
    if any(x < 0 for x in parts) or not any(parts):
        raise click.BadParameter("proportions must be >= 0 and not all 0")
    return parts


def _offload_options() -> list[Callable]:
    kw = dict(expose_value=False, callback=_remember)
    return [
        click.option("--main-gpu", type=click.IntRange(0), default=0, help="GPU for the whole model or its "
                     "small tensors when split (default 0).", **kw),
        click.option("--tensor-split", metavar="P0,P1,..", help="Split layers over GPUs (and RPC devices) in "
                     "these proportions, e.g. 3,1.", **kw),
        click.option("--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto",
                     help="Flash attention.", **kw),
        click.option("--cache-type-k", type=click.Choice(_CACHE_TYPES), help="KV cache type for K (default f16).",
                     **kw),
        click.option("--cache-type-v", type=click.Choice(_CACHE_TYPES), help="KV cache type for V (default f16; "
                     "quantized V needs --flash-attn on).", **kw),
        click.option("--rpc", metavar="HOST:PORT,..", help="llama.cpp ggml-rpc-server devices to put the "
                     "model's layers on, before local GPUs (needs a GGML_RPC=on build; see docs/models.md).", **kw),
    ]


def load_options():
    """LoadOptions from the offload options of the current command (defaults outside a click command)."""
    import gguf

    from ..backend import LoadOptions

    ctx = click.get_current_context(silent=True)
    m = ctx.meta.get(_META, {}) if ctx else {}
    fa = {"on": True, "off": False}.get(m.get("flash_attn") or "auto")

    def ggml_type(name):
        return gguf.GGMLQuantizationType[name.upper()].value if name else None

    rpc = tuple(x.strip() for x in (m.get("rpc") or "").split(",") if x.strip())
    return LoadOptions(main_gpu=m.get("main_gpu") or 0, tensor_split=_tensor_split(m.get("tensor_split")),
                       flash_attn=fa, type_k=ggml_type(m.get("cache_type_k")), type_v=ggml_type(m.get("cache_type_v")),
                       rpc_servers=rpc)


def engine_spec(model, draft, lookup, no_spec, k, n_ctx, ngl, ngl_draft, threads, verbose):
    from ..drafters import LOOKUP, NO_DRAFTER
    from ..loader import EngineSpec

    a = adaptive_settings()
    hybrid = a["hybrid"] or bool(draft and lookup)  # --draft NAME --lookup: lookup first, then the model
    if hybrid and not draft:
        raise click.UsageError("--hybrid needs a drafter model: add --draft NAME|PATH")
    chosen = [x for x in (draft, lookup, no_spec) if x]
    if len(chosen) > 1 and not (hybrid and not no_spec):
        raise click.UsageError("choose one of --draft, --lookup, --no-spec (--draft with --lookup = hybrid)")
    if a["k_min"] > a["k_max"]:
        raise click.UsageError(f"--k-min {a['k_min']} is above --k-max {a['k_max']}")
    d = draft or (LOOKUP if lookup else NO_DRAFTER if no_spec else None)
    return EngineSpec(model=model, draft=d, k=k, n_ctx=n_ctx, threads=threads, ngl=ngl, ngl_draft=ngl_draft,
                      verbose=verbose, load=load_options(), adaptive=not a["no_adaptive"], k_min=a["k_min"],
                      k_max=a["k_max"], hybrid=hybrid, p_min=a["draft_p_min"])


# -- adaptive speculation and the acceptance log (issue 4): ctx.meta too, so commands need no new parameters ------

_ADAPT = "localspec.adaptive"
_ADAPT_DEFAULTS = {"no_adaptive": False, "k_min": 1, "k_max": 8, "hybrid": False, "draft_p_min": 0.0,
                   "metrics_log": None, "task": None}


def _remember_adaptive(ctx: click.Context, param: click.Parameter, value):
    ctx.meta.setdefault(_ADAPT, {})[param.name] = value
    return value


def _adaptive_options() -> list[Callable]:
    kw = dict(expose_value=False, callback=_remember_adaptive)
    return [
        click.option("--no-adaptive", is_flag=True, help="Fixed draft length; speculation never switched off "
                     "(for measurements).", **kw),
        click.option("--k-min", type=click.IntRange(1, 64), default=1, help="Shortest draft the adaptive "
                     "controller may choose (default 1).", **kw),
        click.option("--k-max", type=click.IntRange(1, 64), default=8, help="Longest draft the adaptive "
                     "controller may choose (default 8).", **kw),
        click.option("--hybrid", is_flag=True, help="Prompt lookup first, the --draft model when lookup has no "
                     "match (same as --draft NAME --lookup).", **kw),
        click.option("--draft-p-min", type=click.FloatRange(0, 1), default=0.0, help="Model drafter stops once "
                     "its top probability falls below this (default 0 = never).", **kw),
        click.option("--metrics-log", type=click.Path(dir_okay=False), metavar="FILE", help="Append one JSON "
                     "line per request (acceptance, k chosen, tok/s) to FILE.", **kw),
        click.option("--task", metavar="LABEL", help="Task label recorded in the --metrics-log line.", **kw),
    ]


def adaptive_settings() -> dict:
    """The issue-4 options of the current command (defaults outside a click command)."""
    ctx = click.get_current_context(silent=True)
    m = ctx.meta.get(_ADAPT, {}) if ctx else {}
    return {k: (m[k] if m.get(k) is not None else v) for k, v in _ADAPT_DEFAULTS.items()}


def friendly_errors(f: Callable) -> Callable:
    """LocalspecError -> one line on stderr and its exit code; no traceback."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except LocalspecError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def log_err(msg: str) -> None:
    click.echo(msg, err=True)
