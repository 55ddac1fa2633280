"""llama-server's `samplers` field: the steps of the sampling chain a request runs, by name or by letter.

llama-server builds its chain from the list in the order given and then samples (`dist`); a step that is not
listed does not run. llama.vim and llama.vscode send `["top_k", "top_p", "infill"]`: no temperature (T = 1) and
no penalties, whatever the request's other fields say. Here the listed steps run and the others are set to
their "off" values; the order must be llama.cpp's default one (penalties, top_k, top_p, min_p, temperature),
with `infill` anywhere after the filters. Another order, or a name llama.cpp does not know, is a 400: the warp
runs its steps in one order (sampling/warp.py). llama.cpp's samplers this server does not implement (dry,
top_n_sigma, typ_p, xtc, adaptive_p) are skipped, as their parameters are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ...sampling.infill import Infill
from ...sampling.params import SamplingParams
from ..http import ApiError

if TYPE_CHECKING:
    from ..state import State

ORDER = ("penalties", "top_k", "top_p", "min_p", "temperature")  # llama.cpp's default order, the steps run here
FILTERS = ("penalties", "top_k", "top_p", "min_p")  # what infill must come after
SKIPPED = ("dry", "top_n_sigma", "typ_p", "xtc", "adaptive_p")  # llama.cpp's, not implemented: not applied
_CANONICAL = (*ORDER, "infill", *SKIPPED)
_LETTERS = {"e": "penalties", "k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature", "i": "infill",
            "d": "dry", "s": "top_n_sigma", "y": "typ_p", "x": "xtc", "a": "adaptive_p"}
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p",
            **{c.replace("_", "-"): c for c in _CANONICAL if "_" in c},
            **{c.replace("_", ""): c for c in _CANONICAL if "_" in c}}


class Vocabulary(Protocol):
    """What the infill step reads of the target (backend.Model)."""

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    @property
    def eot(self) -> int: ...


@dataclass(frozen=True)
class Chain:
    """The steps a request listed, in order (the skipped ones dropped)."""

    steps: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return list(self.steps)

    def apply(self, params: SamplingParams, vocab: Vocabulary) -> SamplingParams:
        """`params` with every unlisted step off, and the infill step on when listed."""
        on = set(self.steps)
        off: dict[str, object] = {}
        if "penalties" not in on:
            off.update(repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
        for name, value in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("temperature", 1.0)):
            if name not in on:
                off[name] = value
        if "infill" in on:
            tempered = "temperature" in on and self.steps.index("temperature") < self.steps.index("infill")
            off["infill"] = Infill(piece=vocab.piece, is_eog=vocab.is_eog, eot=vocab.eot, tempered=tempered)
        return replace(params, **off)  # type: ignore[arg-type]


def chained(chain: Chain | None, state: "State", params: SamplingParams) -> SamplingParams:
    """`params` as the request's chain leaves them (unchanged without `samplers`)."""
    return params if chain is None else chain.apply(params, state.engine.target)


def parse_samplers(value: list[str] | str | None) -> Chain | None:
    """The request's `samplers` (names, or a string of llama.cpp's letters) as a Chain; None when absent
    (the default chain). Raises a 400 for an unknown name or an order the warp cannot run."""
    if value is None:
        return None
    names = [_name(v, letter=isinstance(value, str)) for v in value]
    steps = tuple(n for n in names if n not in SKIPPED)
    _check_order(steps)
    return Chain(steps)


def _name(v: str, *, letter: bool) -> str:
    if letter:
        if v not in _LETTERS:
            raise ApiError(400, f"samplers: unknown sampler letter '{v}' (llama.cpp's: {''.join(_LETTERS)})")
        return _LETTERS[v]
    low = v.lower()
    name = low if low in _CANONICAL else _ALIASES.get(low)
    if name is None:
        raise ApiError(400, f"samplers: unknown sampler '{v}' (llama.cpp's: {', '.join(_CANONICAL)})")
    return name


def _check_order(steps: tuple[str, ...]) -> None:
    rest = [s for s in steps if s != "infill"]
    ranks = [ORDER.index(s) for s in rest]
    bad = ranks != sorted(set(ranks)) or steps.count("infill") > 1
    if "infill" in steps:
        at = steps.index("infill")
        bad = bad or any(s in FILTERS for s in steps[at + 1:])
    if bad:
        raise ApiError(400, f"samplers: {list(steps)} is an order this server does not run; it applies llama.cpp's "
                            "default order (penalties, top_k, top_p, min_p, temperature), any of them left out, "
                            "with infill after the filters")
