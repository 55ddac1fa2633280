"""Chained MTP heads (step35's shape): a GGUF with several trained nextn layers, where head i drafts the token at
draft position i from head i-1's hidden state, instead of one head drafting every position from its own.

llama.cpp runs them in the one MTP context of the single-head shape (backend/mtp.py) and picks the layer a decode
runs with `llama_set_nextn_layer_offset` (llama-ext.h, C++ linkage like the other staging calls). Its `draft-mtp`
driver (common/speculative.cpp, `chain_heads`) is the reference this follows, step for step, because llama.cpp's
own `llama-speculative-simple` is the anchor the tests compare drafts with:

- every head's layer needs the context's pairs (x_p, trunk h_{p-1}) in its KV, so the catch-up decodes them once
  per head; a head's KV is a layer of the shared cache, so before each head the cache is cut where the catch-up
  starts and the head's decode refills those cells (one sequence cut only at its end gets the same cells back,
  so the layers written before keep their rows: the check is `tests/test_mtp_chain.py`'s fresh-head test);
- draft step i selects head i, cuts the cache at the last context token and decodes the whole chain again: the
  last token with the trunk's h, then each drafted token with the hidden state of the head that drafted it, the
  last row giving the logits. Head i has never seen the draft region, so it cannot decode just the newest token;
- a draft has at most as many tokens as there are heads (llama.cpp caps `n_max` the same way).

step35's MTP graph picks the output rows before it sets its hidden-state output, so the state read for the next
step is the output row's (unlike qwen35's graph, whose state row 0 is the batch's first row: backend/mtp.py).
"""

from __future__ import annotations

import ctypes
import time
from typing import Sequence

import numpy as np

from .model import Model
from .mtp import MtpHead, _bind, _get_embeddings_nextn_ith, _rows, nextn_layers

_set_nextn_layer_offset = _bind("llama_set_nextn_layer_offset", [ctypes.c_void_p, ctypes.c_int32], None, "i")


class ChainedMtpHead(MtpHead):
    """`MtpHead` for a file with several heads: step i of a draft runs head i (see the module docstring).
    Invariant: every head's layer holds `tokens[p]` at position p, paired with the trunk's h_{p-1}; the draft
    region (from len(tokens) on) is rebuilt at every step and dropped by `finish`."""

    def __init__(self, target: Model) -> None:
        super().__init__(target)
        if self.n_heads < 2:
            raise ValueError(f"{target.path.name} has one MTP head: MtpHead drives it")
        self.max_draft = self.n_heads
        self._chain_tokens: list[int] = []  # the last context token, then the tokens drafted so far ...
        self._chain_h: list[np.ndarray] = []  # ... and the hidden state each is paired with

    def start(self, context: Sequence[int]) -> np.ndarray | None:
        n = len(context)
        keep = self._prepare(context)
        if keep is None:
            return None
        for head in range(self.n_heads):
            self._select(head)
            self._cut(keep)
            self._catch_up(context[:n - 1], keep)
        self.tokens = list(context[:n - 1])
        self._draft_pos = n - 1  # where the chain starts: it is decoded again at every step
        self._chain_tokens, self._chain_h = [context[n - 1]], [self._h_at(n - 2)]
        return self._run_chain()

    def step(self, token: int) -> np.ndarray:
        """Logits for the token after `token`, from the next head over the whole chain."""
        if self._draft_pos < 0:
            raise RuntimeError("ChainedMtpHead.step() before start()")
        if len(self._chain_tokens) >= self.n_heads:
            raise ValueError(f"a chained draft has at most {self.n_heads} tokens, one per head")
        self._chain_h.append(_rows(_get_embeddings_nextn_ith(self._ctx, self._last), 1, self.n_embd)[0].copy())
        self._chain_tokens.append(token)
        return self._run_chain()

    def _run_chain(self) -> np.ndarray:
        self._select(len(self._chain_tokens) - 1)
        self._cut(self._draft_pos)
        self._decode(self._chain_tokens, self._chain_h, self._draft_pos, out=True)
        return self._logits()

    def finish(self) -> None:
        if self._draft_pos >= 0:
            self._cut(self._draft_pos)
            self._select(0)
            self._draft_pos = -1

    def time_step(self, context: Sequence[int], repeats: int = 5) -> float | None:
        """Seconds of a draft's second step (head 1 over a chain of two), the median of `repeats` drafts."""
        times = []
        try:
            for _ in range(repeats):
                if self.start(context) is None:
                    return None
                t0 = time.perf_counter()
                self.step(context[-1])
                times.append(time.perf_counter() - t0)
                self.finish()
        finally:
            self.finish()
        return float(np.median(times))

    def _select(self, head: int) -> None:
        _set_nextn_layer_offset(self._ctx, head)


def open_head(target: Model) -> MtpHead:
    """The driver for the target's heads: chained where it carries several (llama.cpp chains any count above one
    in a context of its own), the single-head one otherwise."""
    return ChainedMtpHead(target) if nextn_layers(target) > 1 else MtpHead(target)
