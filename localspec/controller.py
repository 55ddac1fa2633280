"""Choosing the draft length γ (k) each round.

The loop asks `choose_k()` before drafting (0 = decode plainly this round) and reports every round to
`observe(step)`. `FixedK` is the plain policy; adaptive policies live beside it.
"""

from __future__ import annotations

from typing import Protocol, TYPE_CHECKING

if TYPE_CHECKING:
    from .speculative import Step


class Controller(Protocol):
    def choose_k(self) -> int: ...

    def observe(self, step: "Step") -> None: ...


class FixedK:
    """Always the same draft length: for measurements and for `-k N --no-adaptive`."""

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k = k

    def choose_k(self) -> int:
        return self.k

    def observe(self, step: "Step") -> None:
        pass
