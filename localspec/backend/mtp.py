"""A model's own multi-token-prediction head (llama.cpp's "nextn" layers): a second llama context on the target's
weights that drafts from the target's hidden states.

Qwen3.5/3.6, GLM-4.5+, DeepSeek-V3 and others ship one or more MTP blocks after the trunk. llama.cpp loads them
with `llama_model_params.load_mtp` and runs them in a context made with `ctx_type = LLAMA_CONTEXT_TYPE_MTP` on the
same model. The head at position p reads the pair (token x_p, the trunk's last hidden state h_{p-1}) and predicts
x_{p+1}; its own hidden state then stands in for the trunk's to draft the token after that. llama.cpp's
`common/speculative.cpp` (the `draft-mtp` driver) is the reference this follows.

Three things come from llama.cpp's staging header `src/llama-ext.h`, which llama-cpp-python does not bind and
which has C++ linkage (mangled names): `llama_set_embeddings_nextn` (make a context keep the hidden state each
head reads), `llama_get_embeddings_nextn` / `_ith` (read it). Tokens and hidden states go in together through
the classic `llama_batch` (token ids and `embd` both set), which llama.cpp turns into the same extended batch as
`llama_batch_ext_set_embd_token` (`llama_batch_ext_set_embd_state` is a stub that returns false in this build).

`MtpHead` keeps the target's hidden state for every position the target has decoded (the target calls
`_after_target_decode` after each chunk: `Model.on_decode`), brings the head's own KV cache up to the accepted
context lazily when a draft is asked for, and drops what the draft steps wrote afterwards. This drives one trained
head with a KV cache of its own (qwen35, qwen35moe, glm4moe, deepseek); a file with several heads chains them
(step35: mtp_chain.py, which `open_head` picks); a head that shares the target's cache (gemma4) needs
`llama_get_ctx_other` and is not done yet.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any, Protocol, Sequence

import llama_cpp
import numpy as np

from .model import Model

CTX_TYPE_MTP = 1  # llama.h: LLAMA_CONTEXT_TYPE_MTP


def _mangled(name: str, args: str) -> str:
    """The Itanium C++ ABI name of a free function `name(llama_context *, ...)`: `args` are the codes after it."""
    return f"_Z{len(name)}{name}P13llama_context{args}"


def _bind(name: str, argtypes: list[Any], restype: Any, cpp_args: str | None = None) -> Any:
    """A private binding of a llama.cpp function, by its C name or, for llama-ext.h's, its C++ one."""
    lib = llama_cpp.llama_cpp._lib
    symbol = name if cpp_args is None else _mangled(name, cpp_args)
    fn = lib[symbol]
    fn.argtypes, fn.restype = argtypes, restype
    return fn


_c = ctypes
_set_embeddings_nextn = _bind("llama_set_embeddings_nextn", [_c.c_void_p, _c.c_bool, _c.c_bool], None, "bb")
_get_embeddings_nextn = _bind("llama_get_embeddings_nextn", [_c.c_void_p], _c.c_void_p, "")
_get_embeddings_nextn_ith = _bind("llama_get_embeddings_nextn_ith", [_c.c_void_p, _c.c_int32], _c.c_void_p, "i")
_n_layer_nextn = _bind("llama_model_n_layer_nextn", [_c.c_void_p], _c.c_int32)
_n_embd_out = _bind("llama_model_n_embd_out", [_c.c_void_p], _c.c_int32)


def nextn_layers(model: Model) -> int:
    """How many MTP heads the loaded model carries (0 when it has none or they were not loaded)."""
    return int(_n_layer_nextn(model.model_pointer))


def _rows(address: int | None, n: int, n_embd: int) -> np.ndarray:
    if not address:
        raise RuntimeError("llama.cpp returned no nextn hidden states")
    return np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=(n, n_embd))


class TimedHead(Protocol):
    """A drafter's engine beside the target whose cost c the load-time calibration times (`measure_cost`): the
    target's MTP head, or an EAGLE-3 drafter file (eagle3.py)."""

    target: Model
    source: str  # the drafter's source name: its c's key in Costs.c
    file: Path | None  # the drafter's own file (the calibration's cache key names it); None: the target's heads
    n_heads: int  # the head count (the calibration's cache key names it for the target's heads)

    def time_step(self, context: Sequence[int], repeats: int = 5) -> float | None: ...


class MtpHead:
    """The target's MTP head as a drafter's engine: `start(context)` gives the head's logits for the token after
    the context, `step(token)` feeds a drafted token and gives the next row, `finish()` drops the draft steps.
    Invariant: the head's cache holds `tokens[p]` at position p, each paired with the target's h_{p-1}."""

    max_draft: int | None = None  # the most tokens one draft may have: one head drafts as far as asked
    source: str = "mtp"  # speculative/mtp.py's MTP
    file: Path | None = None  # the heads are in the target's file

    def __init__(self, target: Model) -> None:
        if target.on_decode is not None:
            raise ValueError(f"{target.path.name} already reports its decodes to another reader")
        if not target.options.mtp:
            raise ValueError(f"{target.path.name} was loaded without its MTP heads (LoadOptions.mtp)")
        self.target = target
        self.n_heads = nextn_layers(target)
        if self.n_heads < 1:
            raise ValueError(f"{target.path.name} carries no MTP head (or it was loaded without them)")
        self.n_embd = int(_n_embd_out(target.model_pointer))
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = CTX_TYPE_MTP
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = target.options.n_batch
        params.n_seq_max = 1
        self._threads = target.threads
        params.n_threads, params.n_threads_batch = self._threads
        ctx = llama_cpp.llama_init_from_model(target.model_pointer, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make an MTP context for {target.path.name}")
        self._ctx: Any = ctx
        _set_embeddings_nextn(ctx, True, True)  # the head's own h, for the rows it outputs
        self._batch: Any = llama_cpp.llama_batch_init(target.options.n_batch, 0, 1)
        self._embd = np.zeros((target.options.n_batch, self.n_embd), dtype=np.float32)  # the batch's h rows
        self.tokens: list[int] = []  # in the head's cache
        self._h = np.zeros((256, self.n_embd), dtype=np.float32)  # the target's h_p, position p ...
        self._h_tokens: list[int] = []  # ... for these tokens
        self._stale = 1 << 62  # the first head position whose h_{p-1} was written again since it was decoded
        _set_embeddings_nextn(target.ctx_pointer, True, False)  # every row's hidden state, for the head
        self._draft_pos = -1  # the position of the next draft step; -1: no draft under way
        self._last = 0  # the batch index of the last row decoded with outputs
        target.on_decode = self._after_target_decode

    # -- the target's hidden states ---------------------------------------------------------------------------

    def _after_target_decode(self, start: int, n: int) -> None:
        if start < len(self._h_tokens):
            self._stale = min(self._stale, start + 1)
            del self._h_tokens[start:]
        ctx = self.target.ctx_pointer
        address = _get_embeddings_nextn(ctx)
        if not address:  # a context not asked yet (a flash attention switch rebuilt it): its rows come next time
            _set_embeddings_nextn(ctx, True, False)
            return
        if start > len(self._h_tokens):
            return  # rows before these are missing: `_known` has the target decode them again
        need = start + n
        if need > len(self._h):
            grown = np.zeros((max(need, 2 * len(self._h)), self.n_embd), dtype=np.float32)
            grown[:start] = self._h[:start]
            self._h = grown
        self._h[start:need] = _rows(address, n, self.n_embd)
        self._h_tokens.extend(self.target.tokens[start:need])

    # -- drafting ---------------------------------------------------------------------------------------------

    def start(self, context: Sequence[int]) -> np.ndarray | None:
        """Logits for the token after `context`, from the pair (context[-1], h of the token before it); None when
        the target has not yet decoded context[:-1] (a prompt tail that its first verify pass evaluates)."""
        n = len(context)
        keep = self._prepare(context)
        if keep is None:
            return None
        # the pairs the head lacks, then the last token's pair alone: llama.cpp copies a head's hidden states from
        # the first rows of its batch (its graph does not pick the output rows first), so the row whose hidden
        # state the next draft step reads must be a batch of its own, as in llama.cpp's draft-mtp driver
        self._catch_up(context[:n - 1], keep)
        self._decode(context[n - 1:n], [self._h_at(n - 2)], n - 1, out=True)
        self.tokens = list(context[:n])
        self._draft_pos = n
        return self._logits()

    def _prepare(self, context: Sequence[int]) -> int | None:
        """How much of the head's cache still holds pairs of `context[:-1]` (the cache is cut there), or None when
        the context does not fit or the target has not decoded context[:-1]."""
        n = len(context)
        if n < 1 or n + 1 > self.target.n_ctx:
            return None
        if not self._known(context[:n - 1]):
            return None
        threads = self.target.threads  # the thread controller's choice for the target holds for its head too
        if threads != self._threads:
            llama_cpp.llama_set_n_threads(self._ctx, *threads)
            self._threads = threads
        keep = min(_common_prefix(self.tokens, context[:n - 1]), self._stale)
        self._cut(keep)
        self._stale = 1 << 62
        return keep

    def _catch_up(self, prefix: Sequence[int], keep: int) -> None:
        """Decode the pairs of `prefix` from position `keep` on (no outputs), in batches of n_batch."""
        step = self.target.options.n_batch
        for at in range(keep, len(prefix), step):
            end = min(at + step, len(prefix))
            self._decode(prefix[at:end], [self._h_at(p - 1) for p in range(at, end)], at, out=False)

    def _known(self, prefix: Sequence[int]) -> bool:
        """Whether the target's hidden state of every token of `prefix` is at hand. Rows a decode did not leave
        (one made before the head watched the target's context, e.g. on a context that a flash attention switch
        rebuilt) are made again: the target, which holds `prefix`, decodes that part again."""
        known = _common_prefix(self._h_tokens, prefix)
        target = self.target
        holds = len(target.tokens) == len(prefix) == _common_prefix(target.tokens, prefix)
        if known < len(prefix) and holds:
            keep = target.restore(known)
            target.decode(prefix[keep:], 0)
            known = _common_prefix(self._h_tokens, prefix)
        return known == len(prefix)

    def step(self, token: int) -> np.ndarray:
        """Logits for the token after `token` (the draft so far), from the head's own last hidden state."""
        if self._draft_pos < 0:
            raise RuntimeError("MtpHead.step() before start()")
        h = _rows(_get_embeddings_nextn_ith(self._ctx, self._last), 1, self.n_embd)[0].copy()
        self._decode([token], [h], self._draft_pos, out=True)
        self._draft_pos += 1
        return self._logits()

    def finish(self) -> None:
        """Drop the draft steps from the head's cache: what follows the context comes from the target."""
        if self._draft_pos >= 0:
            self._cut(len(self.tokens))
            self._draft_pos = -1

    def time_step(self, context: Sequence[int], repeats: int = 5) -> float | None:
        """Seconds of one draft step after `context` (the median of `repeats`), for the head's cost c; None when
        the target has not decoded context[:-1]."""
        return time_draft_step(self, context, repeats)

    def _h_at(self, p: int) -> np.ndarray:
        return self._h[p] if p >= 0 else np.zeros(self.n_embd, dtype=np.float32)

    def _cut(self, n: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), 0, n, -1):
            raise RuntimeError(f"llama.cpp could not cut the MTP cache at {n}")
        del self.tokens[n:]

    def _decode(self, tokens: Sequence[int], h: Sequence[np.ndarray], pos: int, *, out: bool) -> None:
        """One batch of (token, h) pairs at pos, pos+1, ...; logits and the head's h for the last row if `out`."""
        decode_pairs(self._ctx, self._batch, self._embd, tokens, np.stack(h), pos, out=out, what="the MTP head")
        self._last = len(tokens) - 1

    def _logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, self._last)
        return np.ctypeslib.as_array(ptr, shape=(self.target.n_vocab,))

    def close(self) -> None:
        if self.target.on_decode == self._after_target_decode:
            self.target.on_decode = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None


PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the head drafts a few tokens."


def time_draft_step(head: Any, context: Sequence[int], repeats: int) -> float | None:
    """Seconds of one draft step of `head` (an MTP head, an EAGLE-3 or DFlash drafter) after `context`, the median of
    `repeats`; None when the target has not decoded context[:-1]. The head is left as it was (`finish`)."""
    if head.start(context) is None:
        return None
    times = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            head.step(context[-1])
            times.append(time.perf_counter() - t0)
    finally:
        head.finish()
    return float(np.median(times))


def decode_pairs(ctx: Any, batch: Any, embd: np.ndarray, tokens: Sequence[int], rows: np.ndarray, pos: int, *,
                 out: bool, what: str) -> None:
    """Decode (token, embedding row) pairs at pos, pos+1, ... in a context whose graph reads both (an MTP head, an
    EAGLE-3 decoder), with an output for the last row only if `out`. `embd` is ours, lent to the batch for the call:
    llama_batch_free must not free it."""
    n = len(tokens)
    embd[:n] = rows
    for i, t in enumerate(tokens):
        batch.token[i] = t
        batch.pos[i] = pos + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = out and i == n - 1
    batch.n_tokens = n
    batch.embd = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    try:
        rc = llama_cpp.llama_decode(ctx, batch)
    finally:
        batch.embd = None
    if rc != 0:
        raise RuntimeError(f"llama_decode of {what} failed with code {rc}")


def measure_cost(head: TimedHead, repeats: int = 5) -> float | None:
    """c: one draft step of the head (an MTP head or an EAGLE-3 drafter) ÷ one one-row decode of the target, timed
    in turns at the same position (medians). The target's cache is left holding the probe's tokens but its last."""
    target = head.target
    probe = target.tokenize(PROBE_TEXT, add_special=True)
    target.restore(0)
    target.decode(probe[:-1], 0)
    steps, rows = [], []
    for _ in range(repeats):
        steps.append(head.time_step(probe, repeats=1))
        target.checkpoint("measure")
        t0 = time.perf_counter()
        target.decode(probe[-1:], 1)
        rows.append(time.perf_counter() - t0)
        target.rewind(len(probe) - 1)
    if any(s is None for s in steps):
        return None
    return float(np.median([s for s in steps if s is not None]) / np.median(rows))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
