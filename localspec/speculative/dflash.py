"""A DFlash drafter file drafts: a small model that names a whole block of tokens in one decode, reading the
target's hidden states (backend/dflash.py drives llama.cpp).

The rows of its block are picked as an MTP head's steps are (speculative/mtp.py `choose`): greedy takes each row's
argmax (what llama.cpp's `draft-dflash` driver takes), sampled the coupled same-seed pick, so the text is plain
decoding's, token for token. Unlike a head it is asked for k rows at once, because its attention inside the block
runs both ways: the block's length changes every row, so a block of k is not the first k rows of a longer one.
Its own source, "dflash": cost c and acceptance are learnt apart from a head's.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np

from ..sampling.params import SamplingParams
from .mtp import MtpDrafter, choose
from .types import EMPTY, Draft, KFor

DFLASH = "dflash"  # the source name and the drafter's name


class BlockHead(Protocol):
    """What the drafter needs of a DFlash drafter (backend.dflash.DFlashHead)."""

    max_draft: int | None

    def block(self, context: Sequence[int], k: int) -> np.ndarray | None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


class DFlashDrafter(MtpDrafter):
    """Drafts with a DFlash drafter file; see the module docstring."""

    name: str = DFLASH
    sources: tuple[str, ...] = (DFLASH,)
    cost: Mapping[str, float | None] = {DFLASH: None}  # timed at load, refined online
    prior: Mapping[str, tuple[float, ...]] = {DFLASH: (0.7, 0.8)}  # the MTP head's prior, learnt online

    def __init__(self, head: BlockHead) -> None:
        self.head = head  # type: ignore[assignment]  # a block drafter: propose below never calls start/step
        self.block_head = head

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        k = k_for(self.name)
        if self.max_k is not None:
            k = min(k, self.max_k)
        if k <= 0:
            return EMPTY
        rows = self.block_head.block(context, k)
        if rows is None:  # the target has not decoded the context's tail yet
            return EMPTY
        try:
            tokens = choose(context, k, params, rng, rows[0], lambda i, t: rows[i + 1])
        finally:
            self.block_head.finish()
        return Draft(tuple(tokens), None, self.name)
