"""EAGLE-3 drafters: a separate GGUF (arch `eagle3`) trained to draft for one target from that target's hidden
states, run by llama.cpp as a model of its own beside the target.

llama.cpp's eagle3 model (src/models/eagle3.cpp) has an encoder graph and a decoder graph. The encoder takes, per
position p, the inputs of three target layers (`llama_model_target_layer_ids`) side by side and projects them
(`fc`) to g_p. The decoder is one decoder layer that reads, at KV position p, the pair (x_{p+1}, g_p): the token
after p and the features at p, and predicts x_{p+2}; its pre-norm output replaces g at the next draft step. Its
token embeddings and lm head are the target's when the file has none, which llama.cpp finds through the draft
context's `ctx_other` (the target's context; llama-cpp-python binds that field). llama.cpp's `draft-eagle3` driver
(common/speculative.cpp) is the reference this follows, because `llama-speculative-simple --spec-type draft-eagle3`
is the anchor the tests compare drafts with.

What llama-cpp-python 0.3.36 does not bind comes from the library it ships, as in mtp.py: the staging header's
`llama_set_embeddings_layer_inp` / `llama_get_embeddings_layer_inp` (make the target keep a layer's input rows),
`llama_model_target_layer_ids(_n)` (C++ linkage: bound by their Itanium names), and mtp.py's nextn calls, which
the eagle3 graphs reuse for g and the decoder's pre-norm state. The encoder runs through `llama_encode` with an
embeddings-only classic batch (rows of 3 × n_embd of the target); the decoder through `llama_decode` with tokens
and g rows both set, as mtp.py feeds its head.

`Eagle3Head` keeps g for every position the target decoded (encoded right after each target decode, as llama.cpp's
`process` does), brings the drafter's KV cache up to the accepted context when a draft is asked for, and drops the
draft steps afterwards. The eagle3 graphs output every row of a batch but llama.cpp copies outputs from the first
rows, so every decode that outputs is a batch of one row, as in llama.cpp's driver.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Sequence

import llama_cpp
import numpy as np

from ..errors import ModelLoadError
from ..models.gguf_header import read_header
from .model import Model
from .mtp import (
    _bind,
    _common_prefix,
    _get_embeddings_nextn,
    _get_embeddings_nextn_ith,
    _rows,
    _set_embeddings_nextn,
    decode_pairs,
    time_draft_step,
)

EAGLE3 = "eagle3"  # the GGUF architecture, the drafter's source name

_c = ctypes
_set_layer_inp = _bind("llama_set_embeddings_layer_inp", [_c.c_void_p, _c.c_uint32, _c.c_bool], None, "jb")
_get_layer_inp = _bind("llama_get_embeddings_layer_inp", [_c.c_void_p, _c.c_uint32], _c.c_void_p, "j")
_layer_ids = _bind("_Z28llama_model_target_layer_idsPK11llama_model", [_c.c_void_p], _c.POINTER(_c.c_int32))
_layer_ids_n = _bind("_Z30llama_model_target_layer_ids_nPK11llama_model", [_c.c_void_p], _c.c_uint32)
_NEVER = 1 << 62


def is_eagle3(path: str | Path) -> bool:
    """Whether the GGUF at `path` is an EAGLE-3 drafter (read from its header; False when it cannot be read)."""
    try:
        return read_header(path, tokens=False).kv.get("general.architecture") == EAGLE3
    except ModelLoadError:
        return False


class Eagle3Head:
    """An EAGLE-3 drafter as a drafter's engine (speculative/eagle3.py): `start(context)` gives the logits for the
    token after the context, `step(token)` feeds a drafted token and gives the next row, `finish()` drops the draft
    steps. Invariant: the drafter's cache holds at position p the pair (tokens[p + 1], g_p)."""

    max_draft: int | None = None  # one decoder layer drafts as far as asked
    source: str = EAGLE3  # speculative/eagle3.py's source: the calibration keeps its c under this name
    n_heads: int = 1  # one decoder layer

    def __init__(self, target: Model, path: str | Path) -> None:
        if target.on_decode is not None:
            raise ValueError(f"{target.path.name} already reports its decodes to another reader")
        self.target, self.path = target, Path(path)
        self.file: Path | None = self.path  # the calibration's cache key names the drafter file
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = target.options.n_gpu_layers
        self._model: Any = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load the EAGLE-3 drafter {self.path.name}")
        self._ctx: Any = None
        self._batch: Any = None
        self._enc: Any = None
        try:
            self._check()
            self._enc = llama_cpp.llama_batch_init(target.options.n_batch, self.n_embd_enc, 1)
            self._batch = llama_cpp.llama_batch_init(target.options.n_batch, 0, 1)
            self._new_context()
        except BaseException:
            self.close()
            raise
        self._embd = np.zeros((target.options.n_batch, self.n_embd), dtype=np.float32)  # the batch's g rows
        self._g = np.zeros((256, self.row_width), dtype=np.float32)  # g_p of the target's position p ...
        self._g_tokens: list[int] = []  # ... for these tokens
        self._stale = _NEVER  # the first position whose g the target wrote again since the pair was decoded
        self._draft_pos = -1  # the position of the next draft step; -1: no draft under way
        self._last = 0  # the batch index of the last row decoded with outputs
        target.on_decode = self._after_target_decode

    @property
    def row_width(self) -> int:
        """The width of the row kept per target position: g (a DFlash drafter keeps the features instead)."""
        return self.n_embd

    def _read_sizes(self) -> None:
        """The drafter's target layers and the widths of both models (shared with backend/dflash.py)."""
        t = self.target
        n = int(_layer_ids_n(self._model))
        ids = _layer_ids(self._model)
        self.layers = [int(ids[i]) for i in range(n)]
        self.n_embd = int(llama_cpp.llama_model_n_embd(self._model))
        self.n_embd_tgt = int(llama_cpp.llama_model_n_embd(t.model_pointer))
        self.n_layer_tgt = int(llama_cpp.llama_model_n_layer(t.model_pointer))
        self.n_embd_enc = n * self.n_embd_tgt

    def _check(self) -> None:
        """Read the drafter's target layers and sizes, and refuse a file that cannot draft for this target."""
        self._read_sizes()
        t, n = self.target, len(self.layers)
        kv = read_header(self.path, tokens=False).kv
        width = int(kv.get(f"{EAGLE3}.target_hidden_size", 0) or 0)
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        if n != 3 or not all(0 <= i <= self.n_layer_tgt for i in self.layers):
            raise ValueError(f"{self.path.name} reads target layers {self.layers}: an EAGLE-3 drafter reads three "
                             f"of the target's {self.n_layer_tgt}")
        if width != self.n_embd_tgt or n_vocab != t.n_vocab:
            raise ValueError(f"{self.path.name} drafts for a target of width {width} and {n_vocab} tokens, not "
                             f"{t.path.name} ({self.n_embd_tgt}, {t.n_vocab})")

    def _new_context(self) -> None:
        """The drafter's context, on the target's current one (ctx_other), and the target's rows switched on."""
        t = self.target
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = t.n_ctx
        params.n_batch = params.n_ubatch = t.options.n_batch
        params.n_seq_max = 1
        self._threads = t.threads
        params.n_threads, params.n_threads_batch = self._threads
        params.ctx_other = t.ctx_pointer
        ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {self.path.name}")
        self._ctx = ctx
        self._n_ubatch = int(llama_cpp.llama_n_ubatch(ctx))  # llama.cpp encodes a batch in one ubatch or aborts
        self._target_ctx = t.context  # held: the identity tells a rebuilt context (its address may be reused)
        _set_embeddings_nextn(ctx, True, True)  # g from the encoder, the pre-norm state from the decoder
        self._switch_target_rows(True)
        self.tokens: list[int] = []

    def _switch_target_rows(self, on: bool) -> None:
        ctx = self.target.ctx_pointer
        for lid in self.layers:
            if lid < self.n_layer_tgt:
                _set_layer_inp(ctx, lid, on)
            else:  # the trunk's last hidden state
                _set_embeddings_nextn(ctx, on, False)

    # -- the target's features --------------------------------------------------------------------------------

    def _after_target_decode(self, start: int, n: int) -> None:
        if start < len(self._g_tokens):
            self._stale = min(self._stale, start)
            del self._g_tokens[start:]
        if self.target.context is not self._target_ctx:  # rebuilt (a flash attention switch)
            self._new_context()  # these rows were not kept: `_known` has the target decode them again
            return
        if start > len(self._g_tokens):
            return
        need = start + n
        if need > len(self._g):
            grown = np.zeros((max(need, 2 * len(self._g)), self._g.shape[1]), dtype=np.float32)
            grown[:start] = self._g[:start]
            self._g = grown
        self._g[start:need] = self._encode(self._features(n))
        self._g_tokens.extend(self.target.tokens[start:need])

    def _features(self, n: int) -> np.ndarray:
        """The target's last decode's rows of each target layer's input, side by side: [n, 3 × n_embd_tgt]."""
        ctx, e = self.target.ctx_pointer, self.n_embd_tgt
        out = np.empty((n, self.n_embd_enc), dtype=np.float32)
        for k, lid in enumerate(self.layers):
            rows = _get_layer_inp(ctx, lid) if lid < self.n_layer_tgt else _get_embeddings_nextn(ctx)
            out[:, k * e:(k + 1) * e] = _rows(rows, n, e)
        return out

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """g for each row of `features`: the drafter's encoder (fc), in batches of n_ubatch."""
        b, step = self._enc, self._n_ubatch
        embd = np.ctypeslib.as_array(b.embd, shape=(step, self.n_embd_enc))
        g = np.empty((len(features), self.n_embd), dtype=np.float32)
        memory = llama_cpp.llama_get_memory(self._ctx)
        for at in range(0, len(features), step):
            m = min(step, len(features) - at)
            embd[:m] = features[at:at + m]
            # the encoder reads no positions, but llama.cpp checks them against the cache: they follow its last
            p0 = int(llama_cpp.llama_memory_seq_pos_max(memory, 0)) + 1
            for i in range(m):
                b.pos[i] = p0 + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = True
            b.n_tokens = m
            rc = llama_cpp.llama_encode(self._ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_encode of the EAGLE-3 drafter failed with code {rc}")
            g[at:at + m] = _rows(_get_embeddings_nextn(self._ctx), m, self.n_embd)
        return g

    def _known(self, prefix: Sequence[int]) -> bool:
        """Whether g of every token of `prefix` is at hand; rows no decode left (a context rebuilt) are made
        again by having the target, which holds `prefix`, decode that part again."""
        known = _common_prefix(self._g_tokens, prefix)
        target = self.target
        holds = len(target.tokens) == len(prefix) == _common_prefix(target.tokens, prefix)
        if known < len(prefix) and holds:
            keep = target.restore(known)
            target.decode(prefix[keep:], 0)
            known = _common_prefix(self._g_tokens, prefix)
        return known == len(prefix)

    # -- drafting ---------------------------------------------------------------------------------------------

    def start(self, context: Sequence[int]) -> np.ndarray | None:
        """Logits for the token after `context`, from the pair (context[-1], g of the token before it); None when
        the target has not decoded context[:-1] or the context is a single token."""
        n = len(context)
        if self.target.context is not self._target_ctx:  # rebuilt: ctx_other must not point at the old one
            self._new_context()
        if n < 2 or n + 1 > self.target.n_ctx or not self._known(context[:n - 1]):
            return None
        self._follow_threads()
        keep = max(0, min(_common_prefix(self.tokens, context) - 1, self._stale, n - 2))  # the last pair: again
        self._cut(keep)
        self._stale = _NEVER
        step = self.target.options.n_batch
        for at in range(keep, n - 2, step):  # the pairs the cache lacks, without outputs
            end = min(at + step, n - 2)
            self._decode(context[at + 1:end + 1], self._g[at:end], at, out=False)
        self._decode(context[n - 1:n], self._g[n - 2:n - 1], n - 2, out=True)  # alone: its row is read
        self.tokens = list(context)
        self._draft_pos = n - 1
        return self._logits()

    def _follow_threads(self) -> None:
        """The thread controller's choice for the target holds for its drafter."""
        threads = self.target.threads
        if threads != self._threads:
            llama_cpp.llama_set_n_threads(self._ctx, *threads)
            self._threads = threads

    def step(self, token: int) -> np.ndarray:
        """Logits for the token after `token` (the draft so far), from the drafter's own pre-norm state."""
        if self._draft_pos < 0:
            raise RuntimeError("Eagle3Head.step() before start()")
        h = _rows(_get_embeddings_nextn_ith(self._ctx, self._last), 1, self.n_embd).copy()
        self._decode([token], h, self._draft_pos, out=True)
        self._draft_pos += 1
        return self._logits()

    def finish(self) -> None:
        """Drop the draft steps from the cache: what follows the context comes from the target."""
        if self._draft_pos >= 0:
            self._cut(len(self.tokens) - 1)
            self._draft_pos = -1

    def time_step(self, context: Sequence[int], repeats: int = 5) -> float | None:
        """Seconds of one draft step after `context` (the median of `repeats`), for the drafter's cost c
        (mtp.py's `measure_cost`, which the load-time calibration runs); None when the target has not decoded
        context[:-1]."""
        return time_draft_step(self, context, repeats)

    def _cut(self, n_pairs: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), 0, n_pairs, -1):
            raise RuntimeError(f"llama.cpp could not cut the EAGLE-3 cache at {n_pairs}")
        del self.tokens[n_pairs + 1:]

    def _decode(self, tokens: Sequence[int], g: np.ndarray, pos: int, *, out: bool) -> None:
        """One batch of (token, g) pairs at pos, pos+1, ...; logits and the pre-norm state of the last row if
        `out` (then a batch of one row: llama.cpp copies outputs from the first rows)."""
        decode_pairs(self._ctx, self._batch, self._embd, tokens, g, pos, out=out, what="the EAGLE-3 drafter")
        self._last = len(tokens) - 1

    def _logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, self._last)
        return np.ctypeslib.as_array(ptr, shape=(self.target.n_vocab,))

    def close(self) -> None:
        target = self.target
        if target.on_decode == self._after_target_decode:
            target.on_decode = None
        if self._ctx is not None:
            if target.context is self._target_ctx:
                self._switch_target_rows(False)  # the target stops keeping rows nobody reads
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        for name in ("_batch", "_enc"):
            if getattr(self, name) is not None:
                llama_cpp.llama_batch_free(getattr(self, name))
                setattr(self, name, None)
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None
