"""The plain policy: the same draft length every round, for every source."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..speculative.types import ControllerState
from .sources import DEFAULT_K

if TYPE_CHECKING:
    from ..speculative.types import Step


class FixedK:
    """Always the same draft length, for every source: for measurements and for `-k N --no-adaptive`."""

    def __init__(self, k: int = DEFAULT_K) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k = k
        self.k_hist: Counter[int] = Counter()

    def choose_k(self) -> int:
        self.k_hist[self.k] += 1
        return self.k

    def k_for(self, source: str) -> int:
        return self.k

    def observe(self, step: "Step") -> None:
        pass

    def state(self) -> "ControllerState":
        return ControllerState(False, dict(self.k_hist), {}, (), {}, {}, {}, None, label=str(self.k), k_now=self.k)

    def policy(self) -> tuple[str, int]:
        return str(self.k), self.k
