"""A scripted stand-in for backend.Model, for pure unit tests of the loop (no llama.cpp).

The fake's "model" is a function next_token(context) -> int; its logits put a large value on that token.
It keeps the same `tokens` invariant as the real Model, and records every decode call.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from localspec.errors import ContextOverflow

EOS = 0


class FakeModel:
    def __init__(self, next_token: Callable[[Sequence[int]], int], *, n_vocab: int = 64, n_ctx: int = 256,
                 name: str = "fake", recurrent: bool = False) -> None:
        self.next_token = next_token
        self.recurrent = recurrent  # like a recurrent state: no cut in place, only back to a checkpoint
        self.checkpoints: dict[str, int] = {}
        self.replayed = 0
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.name = name
        self.tokens: list[int] = []
        self.calls: list[tuple[list[int], int]] = []  # (tokens decoded, logits rows)

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def rewind(self, n_past: int) -> None:
        held = self.tokens[:n_past]
        kept = self.restore(n_past)
        if kept < n_past:  # decoded again, as backend.Model does
            self.tokens.extend(held[kept:])
            self.replayed += n_past - kept

    @property
    def cuts_in_place(self) -> bool:
        return not self.recurrent

    def restore(self, n_past: int) -> int:
        if n_past >= len(self.tokens):
            return len(self.tokens)
        if self.recurrent:
            self.checkpoints = {t: p for t, p in self.checkpoints.items() if p <= n_past}
            n_past = max(self.checkpoints.values(), default=0)
        del self.tokens[n_past:]
        return n_past

    def checkpoint(self, tag: str, *, ahead: int = 0, keep_last: bool = False) -> None:
        self.checkpoints[tag] = len(self.tokens)

    def decode(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextOverflow("fake context full")
        self.calls.append((list(tokens), logits_rows))
        start = len(self.tokens)
        self.tokens.extend(tokens)
        out = np.zeros((logits_rows, self.n_vocab), dtype=np.float32)
        for r in range(logits_rows):
            end = start + len(tokens) - logits_rows + r + 1  # context up to and including this row's token
            out[r, self.next_token(self.tokens[:end])] = 10.0
        return out

    def close(self) -> None:
        pass


def counting(mod: int = 50) -> Callable[[Sequence[int]], int]:
    """next = last + 1 (skipping EOS)."""
    return lambda ctx: (ctx[-1] % (mod - 1)) + 1
