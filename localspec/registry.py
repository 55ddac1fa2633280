"""models.toml -> frozen dataclasses; resolve a model name or path to a GGUF file on disk.

(v0: the shipped file only; the overlay, hub sources and validation come with the model-management issue.)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .embedded import package_file
from .errors import ModelNotFound


@dataclass(frozen=True)
class ModelEntry:
    name: str
    package: str | None = None
    pip: str | None = None
    path: str | None = None
    n_ctx: int | None = None
    description: str = ""


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    drafter: str
    k: int = 4


@dataclass(frozen=True)
class Registry:
    default: str
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]

    def pair_for(self, model: str) -> PairEntry | None:
        return next((p for p in self.pairs.values() if p.target == model), None)


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    entry: ModelEntry | None


def load_registry() -> Registry:
    data = tomllib.loads(resources.files("localspec").joinpath("models.toml").read_text())
    models = {n: ModelEntry(name=n, **v) for n, v in data.get("models", {}).items()}
    pairs = {n: PairEntry(name=n, **v) for n, v in data.get("pairs", {}).items()}
    return Registry(data["default"], models, pairs)


def resolve_model(spec: str | None, registry: Registry | None = None, *, log=print) -> ResolvedModel:
    """None -> the default model; an existing path -> that file; else a registry name."""
    reg = registry or load_registry()
    if spec is None:
        spec = reg.default
    entry = reg.models.get(spec)
    if entry is None:
        p = Path(spec).expanduser()
        if p.suffix == ".gguf" or p.exists() or "/" in spec:
            return ResolvedModel(p.name, p, None)
        raise ModelNotFound(f"unknown model '{spec}'; 'localspec models list' shows the names, or pass a .gguf path")
    if entry.path:
        return ResolvedModel(spec, Path(entry.path).expanduser(), entry)
    if entry.package:
        dist, _, version = (entry.pip or "").partition("==")
        return ResolvedModel(spec, package_file(dist, entry.package, version or None, log=log), entry)
    raise ModelNotFound(f"model '{spec}' has no usable source")
