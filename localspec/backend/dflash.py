"""DFlash drafters: a separate GGUF (arch `dflash`) that drafts a whole block in one decode from the target's
hidden states, run by llama.cpp as a model of its own beside the target.

llama.cpp's dflash model (src/models/dflash.cpp) is one decoder with two modes. An embeddings-only batch carries,
per target position, the inputs of the target layers `llama_model_target_layer_ids` side by side; it projects them
(`fc`) and writes them as K/V into every layer's cache at that position ("injection"). A token batch, the block
[last token, mask × k] at the positions after the context, attends over that cache and, non-causally, over the
whole block; its rows 1..k are the draft, read at once, not token by token. Token embeddings and lm head are the
target's through `ctx_other`, as for EAGLE-3. llama.cpp's `draft-dflash` driver (common/speculative.cpp) is the
reference, because `llama-speculative-simple --spec-type draft-dflash` is the anchor the tests compare drafts with.

Most of the plumbing is EAGLE-3's (backend/eagle3.py): the target keeps the same layer inputs, the drafter's
context shares the target's (`ctx_other`), a rebuilt target context makes a new one, and rows are kept per target
position so the cache can be brought up to any accepted context. What differs: the rows kept are the raw features
(no encoder call; the injection is a `llama_decode` of an embeddings batch whose row width llama.cpp takes as the
encoder's for a dflash context), attention is non-causal, and a draft is one block decode whose length changes
every row (non-causal), so the drafter asks for k rows at once. DFlash2/DSpark variants (a selector lattice, a
Markov head) and M-RoPE drafters are refused: no fixture exists to check them against llama.cpp.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import llama_cpp
import numpy as np

from ..errors import ModelLoadError
from ..models.gguf_header import read_header
from .eagle3 import _NEVER, Eagle3Head
from .model import Model
from .mtp import _bind, _common_prefix

DFLASH = "dflash"  # the GGUF architecture, the drafter's source name

_selector_top_k = _bind("_Z33llama_model_dflash_selector_top_kPK11llama_model", [llama_cpp.ctypes.c_void_p],
                        llama_cpp.ctypes.c_int32)


def is_dflash(path: str | Path) -> bool:
    """Whether the GGUF at `path` is a DFlash drafter (read from its header; False when it cannot be read)."""
    try:
        return read_header(path, tokens=False).kv.get("general.architecture") == DFLASH
    except ModelLoadError:
        return False


class DFlashHead(Eagle3Head):
    """A DFlash drafter as a drafter's engine (speculative/dflash.py): `block(context, k)` gives k rows of logits
    for the k tokens after the context, `finish()` drops the block. Invariant: the drafter's cache holds at
    position p the features of the target's token p, for p < len(tokens) - 1."""

    source: str = DFLASH  # speculative/dflash.py's source: the calibration keeps its c under this name

    def __init__(self, target: Model, path: str | Path) -> None:
        super().__init__(target, path)
        self.max_draft = self.block_size - 1  # the block holds the last token and k masks (llama.cpp's clamp)

    @property
    def row_width(self) -> int:
        return self.n_embd_enc  # the raw features: the injection decode projects them itself

    def _check(self) -> None:
        """Read the drafter's layers, sizes and block settings; refuse what this driver cannot run."""
        self._read_sizes()
        t, kv = self.target, read_header(self.path, tokens=False).kv
        self.block_size = int(kv.get(f"{DFLASH}.block_size", 16) or 16)
        self.causal = str(kv.get(f"{DFLASH}.attention.causal", "false")).lower() == "true"
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.mask = int(llama_cpp.llama_vocab_mask(vocab))
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        if kv.get("general.architecture") != DFLASH:
            raise ValueError(f"{self.path.name} is no DFlash drafter")
        if not self.layers or not all(0 <= i < self.n_layer_tgt for i in self.layers):
            raise ValueError(f"{self.path.name} reads target layers {self.layers}, not within the target's "
                             f"{self.n_layer_tgt}")
        if self.n_embd != self.n_embd_tgt or n_vocab != t.n_vocab:
            raise ValueError(f"{self.path.name} drafts for a target of width {self.n_embd} and {n_vocab} tokens, "
                             f"not {t.path.name} ({self.n_embd_tgt}, {t.n_vocab})")
        if self.mask < 0 or self.block_size < 2:
            raise ValueError(f"{self.path.name} has no mask token or a block of under 2")
        if int(_selector_top_k(self._model)) > 0 or any(k.startswith(("markov", "selector")) for k in kv):
            raise ValueError(f"{self.path.name} is a DFlash2/DSpark drafter, which localspec does not run")
        if llama_cpp.llama_model_rope_type(self._model) == llama_cpp.LLAMA_ROPE_TYPE_MROPE:
            raise ValueError(f"{self.path.name} is an M-RoPE drafter (4 positions a row), which localspec "
                             "does not run")

    def _new_context(self) -> None:
        super()._new_context()
        llama_cpp.llama_set_causal_attn(self._ctx, self.causal)  # the block attends both ways unless told

    def _encode(self, features: np.ndarray) -> np.ndarray:
        return features  # kept as they are: the injection decode projects them

    def block(self, context: Sequence[int], k: int) -> np.ndarray | None:
        """k rows of logits for the k tokens after `context`, from one decode of [context[-1], mask × k]; None
        when the target has not decoded context[:-1] or the context is a single token."""
        n = len(context)
        if self.target.context is not self._target_ctx:  # rebuilt: ctx_other must not point at the old one
            self._new_context()
        k = min(k, self.block_size - 1)
        if k < 1 or n < 2 or n + k > self.target.n_ctx or not self._known(context[:n - 1]):
            return None
        self._follow_threads()
        keep = max(0, min(_common_prefix(self.tokens, context), len(self.tokens) - 1, self._stale, n - 1))
        self._cut(keep)
        self._stale = _NEVER
        self._inject(keep, n - 1)
        self.tokens = list(context)
        self._draft_pos = n - 1
        self._fill([context[-1]] + [self.mask] * k, n - 1, out=True)
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode of the DFlash block failed with code {rc}")
        return np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, i),
                                               shape=(self.target.n_vocab,)) for i in range(1, k + 1)])

    def _inject(self, lo: int, hi: int) -> None:
        """Write the features of positions lo..hi-1 into the drafter's cache, in batches of n_ubatch."""
        b, step = self._enc, self._n_ubatch
        embd = np.ctypeslib.as_array(b.embd, shape=(step, self.n_embd_enc))
        for at in range(lo, hi, step):
            m = min(step, hi - at)
            embd[:m] = self._g[at:at + m]
            self._fill(range(at, at + m), at, out=False, batch=b)
            rc = llama_cpp.llama_decode(self._ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode of the DFlash injection failed with code {rc}")

    def _fill(self, tokens: Sequence[int], pos: int, *, out: bool, batch: Any = None) -> None:
        """Set a batch's rows at pos, pos+1, ... (tokens ignored for the embeddings batch)."""
        b = self._batch if batch is None else batch
        for i, t in enumerate(tokens):
            if batch is None:
                b.token[i] = t
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = out
        b.n_tokens = len(tokens)

    def start(self, context: Sequence[int]) -> np.ndarray | None:
        raise NotImplementedError("a DFlash drafter drafts a block at once: DFlashHead.block")

    def step(self, token: int) -> np.ndarray:
        raise NotImplementedError("a DFlash drafter drafts a block at once: DFlashHead.block")

    def time_step(self, context: Sequence[int], repeats: int = 5) -> float | None:
        """Seconds of a one-token block after `context` (the median of `repeats`), for the drafter's cost c: a
        block of k costs about as much for the small k drafted here (one decode of k + 1 rows)."""
        times = []
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                if self.block(context, 1) is None:
                    return None
                times.append(time.perf_counter() - t0)
                self.finish()
        finally:
            self.finish()
        return float(np.median(times))
