"""What the registry knows, as one list: each model's file (or that it is not on disk), its size and weights,
and the drafter it loads with. `localspec models list` and the chat's model picker read it; it never downloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import LocalspecError
from . import LOOKUP
from .hub import quant_of
from .model_facts import quick_facts
from .registry import ModelEntry, Registry, load_registry
from .resolve import entry_path


@dataclass(frozen=True)
class Known:
    """One registry model as this machine has it."""

    name: str
    entry: ModelEntry
    path: Path | None  # None: not on disk ('localspec models pull NAME' gets it)
    size_bytes: int | None
    quant: str | None
    arch: str | None
    drafter: str  # the drafter it loads with: its pair's, else prompt lookup
    pairs: tuple[str, ...]  # the pairs it is part of (as target or drafter)
    default: bool
    problem: str | None = None  # why a file that is there cannot be used (not a GGUF, truncated)

    @property
    def present(self) -> bool:
        return self.path is not None


def _quant(e: ModelEntry, facts: dict) -> str | None:
    named = e.file or e.package or e.path
    return facts.get("quant") or e.quant or (quant_of(named) if named else None)


def known(name: str, reg: Registry) -> Known:
    e = reg.models[name]
    path: Path | None = None
    facts: dict = {}
    problem = None
    try:
        path = entry_path(e, fetch=False)
        facts = quick_facts(path)
    except LocalspecError as err:  # not downloaded or not assembled (absent), or a damaged file (a problem)
        problem = str(err) if path is not None else None
        path = None
    pair = reg.pair_for(name)
    return Known(name, e, path, facts.get("size_bytes"), _quant(e, facts), facts.get("arch"),
                 pair.drafter if pair else LOOKUP, tuple(p.name for p in reg.pairs_with(name)), name == reg.default,
                 problem)


def catalog(registry: Registry | None = None) -> list[Known]:
    """Every registry model, in the registry's order."""
    reg = registry or load_registry()
    return [known(name, reg) for name in reg.models]


def human_size(n: float | None) -> str:
    """Bytes in decimal units, as `ls -h --si` and the model hubs print them ('-' when unknown)."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"
