"""Every model the router can serve, each as the `localspec serve` options its runner gets.

Sources, first name wins: the registry (models.toml: what is on disk, and the embedded default, which the
runner fetches), a presets file ([NAME] sections in the spirit of llama-server's --models-preset), the GGUFs
in --models-dir folders (named by file stem), and the hub cache (named owner/repo:QUANT, as pulled).
A registry model's runner gets `--model NAME`, so it resolves its models.toml pair itself and pairs stay pairs;
a preset can give any model a drafter (`draft = ...`) or its own --ctx, --ngl, ...
A preset with llama-server's `dedup-cache-models = true` (its own or [*]'s) hides the hub-cache entry of the
file it serves, so the model is listed once, by the preset's name.
"""

from __future__ import annotations

import configparser
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LocalspecError
from ..models import LOOKUP
from ..models.candidates import local_files
from ..models.catalog import Known, catalog
from ..models.hub import quant_of
from ..models.model_facts import trained_context
from ..models.registry import load_registry

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

if TYPE_CHECKING:
    from ..engine.loader import EngineConfig

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
_HUB_REPO = re.compile(r"models--([^/]+?)--([^/]+)$")
# llama-server's preset keys (its long option names) -> localspec serve's
_PRESET_ALIASES = {"ctx-size": "ctx", "c": "ctx", "n-gpu-layers": "ngl", "gpu-layers": "ngl", "m": "model",
                   "model-draft": "draft", "md": "draft", "n-gpu-layers-draft": "ngl-draft", "t": "threads",
                   "draft-max": "k-max", "draft-min": "k-min", "gpu-layers-draft": "ngl-draft"}
GLOBAL_SECTION = "*"
DEDUP = "dedup-cache-models"  # a preset-only key (llama-server's), not a serve option
DEFAULT_CTX = 4096  # engine/loader.py's DEFAULT_CTX restated: importing the loader would load llama.cpp here


@dataclass(frozen=True)
class ModelSpec:
    """One model the router knows: its name, its file (None: the runner fetches it, e.g. the embedded
    default), and every option its runner's `localspec serve` gets (the router adds --host/--port)."""

    name: str
    path: Path | None
    args: tuple[str, ...]
    source: str = "models.toml"  # "models.toml", "preset", "models dir", "hub cache"
    draft_path: Path | None = None  # the drafter's file, for the memory estimate
    n_ctx: int | None = None
    ngl: int | None = None
    aliases: tuple[str, ...] = field(default=())


def engine_args(config: EngineConfig) -> tuple[str, ...]:
    """The engine options the user gave the router, as every runner's command line (the model is per runner;
    --draft auto/self, --lookup and --no-spec apply to each model, a --draft file to none)."""
    from ..speculative.types import NO_DRAFTER
    from ..tuning.sources import K_MAX, K_MIN

    a: list[str] = []
    pairs: list[tuple[str, Any]] = [("--ctx", config.n_ctx), ("--threads", config.threads), ("--ngl", config.ngl),
                                    ("--ngl-draft", config.ngl_draft), ("-k", config.k)]
    if config.draft in ("auto", "self"):
        pairs.append(("--draft", config.draft))
    a += [x for flag, v in pairs if v is not None for x in (flag, str(v))]
    a += {LOOKUP: ["--lookup"], NO_DRAFTER: ["--no-spec"]}.get(config.draft or "", [])
    a += ["--verbose"] * config.verbose + ["--no-adaptive"] * (not config.adaptive)
    a += [x for flag, v, default in (("--k-min", config.k_min, K_MIN), ("--k-max", config.k_max, K_MAX))
          if v != default for x in (flag, str(v))]  # the defaults left implicit: lookup's longer reach needs it
    if config.p_min:
        a += ["--draft-p-min", str(config.p_min)]
    for d in config.models_dirs:
        a += ["--models-dir", str(d)]
    return (*a, *_load_args(config))


def _load_args(config: EngineConfig) -> list[str]:
    """The offload options (LoadOptions) back as flags."""
    import gguf

    lo = config.load
    a = ["--main-gpu", str(lo.main_gpu)] if lo.main_gpu else []
    if lo.tensor_split:
        a += ["--tensor-split", ",".join(f"{x:g}" for x in lo.tensor_split)]
    if lo.flash_attn is not None:
        a += ["--flash-attn", "on" if lo.flash_attn else "off"]
    for flag, t in (("--cache-type-k", lo.type_k), ("--cache-type-v", lo.type_v)):
        if t is not None:
            a += [flag, gguf.GGMLQuantizationType(t).name.lower()]
    if lo.rpc_servers:
        a += ["--rpc", ",".join(lo.rpc_servers)]
    if lo.mmap is not None:
        a.append("--mmap" if lo.mmap else "--no-mmap")
    a += {"all": ["--repack"], "none": ["--no-repack"]}.get(lo.fast_path or "", [])
    return a


def context_for(path: Path | None, n_ctx: int | None) -> int:
    """The n_ctx the runner's loader will choose (loader.context_length): the asked one, else 4096, capped
    at the trained context."""
    if n_ctx:
        return n_ctx
    try:
        trained = trained_context(path) if path is not None else None
    except LocalspecError:
        trained = None
    return min(DEFAULT_CTX, trained or DEFAULT_CTX)


def _registry_spec(k: Known, known: dict[str, Known], base: tuple[str, ...], config: EngineConfig) -> ModelSpec:
    """A registry model: `--model NAME`; its pair's drafter when that is on disk, else prompt lookup."""
    args: tuple[str, ...] = ("--model", k.name)
    draft_path = None
    if k.drafter != LOOKUP and config.draft is None:
        drafter = known.get(k.drafter)
        if drafter is None or drafter.path is None:
            args += ("--lookup",)  # the pair's drafter is not downloaded: the target alone still serves
        else:
            draft_path = drafter.path
    ngl = config.ngl if config.ngl is not None else k.entry.n_gpu_layers
    return ModelSpec(k.name, k.path, (*args, *base), "models.toml", draft_path,
                     context_for(k.path, config.n_ctx or k.entry.n_ctx), ngl)


def _file_name(path: Path, origin: str) -> str | None:
    """A models-dir file by its stem; a hub file as owner/repo:QUANT; the 2nd.. shard of a set: None."""
    stem = path.stem
    shard = _SHARD.search(stem)
    if shard and shard.group(1) != "00001":
        return None
    stem = _SHARD.sub("", stem)
    if origin != "hub cache":
        return stem
    repo = next((m for p in path.parents if (m := _HUB_REPO.search(p.name))), None)
    if repo is None:
        return stem
    return f"{repo.group(1)}/{repo.group(2)}:{quant_of(path.name) or stem}"


def _file_specs(config: EngineConfig, base: tuple[str, ...], taken: set[str]) -> list[ModelSpec]:
    """GGUFs in --models-dir folders and the hub cache that the registry does not name."""
    out = []
    for f in local_files(config.models_dirs):
        if f.origin not in ("models dir", "hub cache"):
            continue
        name = _file_name(f.path, f.origin)
        if name is None or name in taken:
            continue
        taken.add(name)
        out.append(ModelSpec(name, f.path, ("--model", str(f.path), *base), f.origin, None,
                             context_for(f.path, config.n_ctx), config.ngl or 0))
    return out


def discover(config: EngineConfig, presets: Path | None = None) -> dict[str, ModelSpec]:
    """name -> ModelSpec for every model this router can serve (see the module docstring for the order)."""
    known = {k.name: k for k in catalog(load_registry())}
    base = engine_args(config)
    specs: dict[str, ModelSpec] = {}
    for k in known.values():
        if k.present or k.default:
            specs[k.name] = _registry_spec(k, known, base, config)
    sections = read_presets(presets) if presets else {}
    shared_values, dedup_all = _without_dedup(sections.pop(GLOBAL_SECTION, {}))
    shared = preset_args(shared_values)
    hidden: set[Path | str] = set()  # the files (and hub names) of the presets that deduplicate the cache
    for name, values in sections.items():
        values, dedup = _without_dedup(values)
        specs[name] = _preset_spec(name, values, specs.get(name), (*base, *shared), known, config)
        spec = specs[name]
        if dedup_all if dedup is None else dedup:  # its model's name (a hub owner/repo:QUANT) and its file
            hidden |= {spec.args[1], *((spec.path.resolve(),) if spec.path else ())}
    if shared:
        specs = {n: s if s.source == "preset" else _with(s, shared) for n, s in specs.items()}
    for s in _file_specs(config, (*base, *shared), set(specs)):
        if s.source != "hub cache" or not ({s.name, s.path.resolve() if s.path else None} & hidden):
            specs[s.name] = s
    return specs


def _without_dedup(values: dict[str, Any]) -> tuple[dict[str, Any], bool | None]:
    """A section's options without `dedup-cache-models`, and that key's value (None: not set)."""
    rest = {k: v for k, v in values.items() if _key(k) != DEDUP}
    flag = next((v for k, v in values.items() if _key(k) == DEDUP), None)
    if flag is None:
        return rest, None
    return rest, flag is True or str(flag).strip().lower() in ("1", "true", "on", "yes")


def _with(spec: ModelSpec, extra: tuple[str, ...]) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, args=(*spec.args, *extra))


# -- presets ------------------------------------------------------------------------------------------------------

def read_presets(path: Path) -> dict[str, dict[str, Any]]:
    """[NAME] sections of options, from TOML (.toml) or INI (anything else, as llama-server's --models-preset);
    a [*] section applies to every model."""
    try:
        text = Path(path).expanduser().read_text()
        if Path(path).suffix == ".toml":
            data = tomllib.loads(text)
            return {str(k): dict(v) for k, v in data.items() if isinstance(v, dict)}
        ini = configparser.ConfigParser(interpolation=None, default_section="\0")
        ini.read_string(text, source=str(path))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LocalspecError(f"cannot read the presets file {path}: {first}; fix it, then start again or reload "
                             "(GET /models?reload=1)") from None
    return {s: dict(ini[s]) for s in ini.sections()}


def _key(k: str) -> str:
    k = k.strip().lstrip("-").lower().replace("_", "-")
    return _PRESET_ALIASES.get(k, k)


def preset_args(values: dict[str, Any]) -> tuple[str, ...]:
    """A section's options (but `model`) as serve flags: `ctx = 2048` -> --ctx 2048, `lookup = true` ->
    --lookup, a false flag is left out."""
    a: list[str] = []
    for k, v in values.items():
        key = _key(k)
        if key == "model":
            continue
        flag = "-k" if key == "k" else f"--{key}"
        if isinstance(v, bool) or str(v).strip().lower() in ("true", "false", "on", "off", ""):
            if v is True or str(v).strip().lower() in ("true", "on", ""):
                a.append(flag)
            continue
        a += [flag, str(v)]
    return tuple(a)


def _file_or_none(value: str | None, known: dict[str, Known]) -> Path | None:
    """A preset's model or draft as a file: a path, else a registry model on disk; None when neither."""
    if not value:
        return None
    p = Path(value).expanduser()
    if p.is_file():
        return p
    k = known.get(value)
    return k.path if k is not None else None


def _preset_spec(name: str, values: dict[str, Any], existing: ModelSpec | None, base: tuple[str, ...],
                 known: dict[str, Known], config: EngineConfig) -> ModelSpec:
    """A preset section: its model (a path or registry name; default the section's name), the engine and [*]
    options (`base`), then its own (click keeps the last of a repeated option, so the section wins)."""
    norm = {_key(k): v for k, v in values.items()}
    model = str(norm.get("model") or (existing.args[1] if existing else name))
    path = _file_or_none(model, known) or (existing.path if existing else None)
    own = preset_args(values)
    draft = _file_or_none(str(norm["draft"]), known) if norm.get("draft") else None
    ctx = int(norm["ctx"]) if norm.get("ctx") else config.n_ctx
    ngl = int(norm["ngl"]) if norm.get("ngl") not in (None, "") else config.ngl
    return ModelSpec(name, path, ("--model", model, *base, *own), "preset",
                     draft or (existing.draft_path if existing else None), context_for(path, ctx), ngl)


def canonical(name: str, specs: dict[str, ModelSpec]) -> str | None:
    """The spec a client's model name means: exact, then without Ollama's ':latest' tag, then an alias, then
    a hub name without its quant (owner/repo -> owner/repo:Q4_K_M when only one is cached)."""
    if name in specs:
        return name
    bare = name.removesuffix(":latest")
    if bare in specs:
        return bare
    for s in specs.values():
        if name in s.aliases or bare in s.aliases:
            return s.name
    hub = [n for n in specs if n.startswith(bare + ":")]
    return hub[0] if len(hub) == 1 else None
