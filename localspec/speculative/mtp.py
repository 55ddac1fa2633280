"""The drafter inside the model: the target's own multi-token-prediction (MTP) head drafts the next tokens.

A GGUF of Qwen3.5/3.6, GLM-4.5+ or DeepSeek-V3 can carry MTP ("nextn") blocks that were trained with the trunk
to predict one token further from its last hidden state. No second model is loaded: the head runs on the
target's weights in a context of its own (backend/mtp.py drives llama.cpp), reading the hidden states the
target's own decodes left behind. To the loop it is one more drafter with one source, "mtp", whose cost c the
load-time calibration measures and whose acceptance the controller learns as it does a model drafter's.

A draft is chosen as `ModelDrafter` chooses its coupled one: a greedy request takes the head's argmax (what
llama.cpp's `draft-mtp` driver takes), a sampled one picks at the uniform the target will draw at that position,
so the same-seed rule verifies it and the text is plain decoding's, token for token (verify.py).
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from ..sampling.constrain import constrain_row
from ..sampling.params import SamplingParams
from ..sampling.warp import warp
from .drafters import peek
from .types import EMPTY, Draft, KFor

MTP = "mtp"  # the source name, the drafter's name and `--draft mtp`


def choose(context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator, first: np.ndarray,
           next_row: Callable[[int, int], np.ndarray]) -> list[int]:
    """k draft tokens from rows of logits: `first`, then `next_row(i, token i)` for row i + 1 (a head's next step,
    or a DFlash block's next row). Greedy takes the argmax, sampled the coupled same-seed pick (module docstring)."""
    tokens: list[int] = []
    u = [] if params.greedy else peek(rng, k)
    logits = first
    for i in range(k):
        row = constrain_row(params, logits, context, tokens)  # q constrained as p is (constrain.py)
        q = warp(row, params, context, tokens)  # the history the target's verify row i will see
        t = int(q.ids[0, int(np.argmax(q.probs[0]))]) if params.greedy else q.pick(0, u[i])
        tokens.append(t)
        if i < k - 1:
            logits = next_row(i, t)
    return tokens


class Head(Protocol):
    """What the drafter needs of an MTP head (backend.mtp.MtpHead; tests may drive a fake)."""

    def start(self, context: Sequence[int]) -> np.ndarray | None: ...

    def step(self, token: int) -> np.ndarray: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


class MtpDrafter:
    """Drafts with the target's MTP head; see the module docstring."""

    name: str = MTP
    sources: tuple[str, ...] = (MTP,)
    cost: Mapping[str, float | None] = {MTP: None}  # measured at load (tuning/calibration.py), refined online
    # learnt online, as a model drafter's; published heads accept ~0.6-0.8 of first positions and a little less
    # than a small model's later ones (one head reused past its trained offset): docs/bench/mtp.md#prior
    prior: Mapping[str, tuple[float, ...]] = {MTP: (0.7, 0.8)}

    def __init__(self, head: Head) -> None:
        self.head = head

    @property
    def max_k(self) -> int | None:
        """The longest draft the head can make, None for any: chained heads draft one token each (mtp_chain.py),
        so the controller plans γ within it (engine/loader.py `_k_range`) and prices no draft it cannot make."""
        return getattr(self.head, "max_draft", None)

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        k = k_for(self.name)
        if self.max_k is not None:
            k = min(k, self.max_k)
        if k <= 0:
            return EMPTY
        logits = self.head.start(context)
        if logits is None:  # the target has not decoded the context's tail yet
            return EMPTY
        try:
            tokens = choose(context, k, params, rng, logits, lambda i, t: self.head.step(t))
        finally:
            self.head.finish()
        return Draft(tuple(tokens), None, self.name)

    def close(self) -> None:
        self.head.close()
