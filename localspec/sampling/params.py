"""SamplingParams: what a request asks of the sampler, llama.cpp's names and defaults ("off" values).

A leaf: the warp, the penalties, the constraints, the drafters and every front end read it, and it reads none
of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .constrain import Constraint
    from .infill import Infill


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repeat_penalty: float = 1.0  # 1 = off; llama.cpp's: logit > 0 divided by it, else multiplied
    repeat_last_n: int = 64  # tokens of history the penalties look at (0 = off, -1 = all)
    presence_penalty: float = 0.0  # subtracted once from the logit of every token in that window
    frequency_penalty: float = 0.0  # subtracted per occurrence in that window
    seed: int | None = None
    # per request, not warps: each emitted token's logprob and the top n (None = off; see logprobs.py), and
    # a logits transform applied to p and q alike before the warp (logit_bias, grammar; see constrain.py)
    logprobs: int | None = None
    constraint: "Constraint | None" = None
    # llama.cpp's infill sampler after the filters (None = not in the chain; infill.py), on p and q alike
    infill: "Infill | None" = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be >= -1 (-1 = the whole history), got {self.repeat_last_n}")
        if not (math.isfinite(self.presence_penalty) and math.isfinite(self.frequency_penalty)):
            raise ValueError("presence_penalty and frequency_penalty must be finite")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalised(self) -> bool:
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)
