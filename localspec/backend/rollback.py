"""Rewinding a memory that llama.cpp cannot cut: the recurrent state of Mamba, RWKV, LFM2, Qwen3.5 and friends.

An attention model's KV cache drops any suffix (`llama_memory_seq_rm`). A recurrent layer keeps one state per
sequence, the sum of everything it has read, and no earlier state survives in it; a hybrid model has both kinds
of layer, and the recurrent part decides. To go back to position n, localspec restores a copy of the state taken
at some position c <= n (a checkpoint) and decodes tokens[c:n] again (the replay). Nothing else is exact, and
nothing here ever leaves a state that does not match the tokens the model says it holds: with no usable
checkpoint, the state is cleared and the whole prefix is replayed.

Where a checkpoint's copy lives is the `method`, chosen per model at load by timing each (`choose`):
- "seq": a spare sequence of the same context (`llama_memory_seq_cp` shares the state's cell; llama.cpp copies it
  on the device when sequence 0 decodes next). Needs a context with spare sequences and a unified KV cache, and
  is not used with llama.cpp's per-token snapshots (below), whose rolled-back state it would not copy.
- "host": the recurrent part of sequence 0 copied to host memory (`llama_state_seq_get_data_ext` with
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), restored with `set_data_ext`; the attention part of a hybrid is cut as usual.
Besides either, llama.cpp keeps per-token snapshots of the last decode for some architectures (the context's
`n_rs_seq`; llama.cpp clamps it to 0 elsewhere). A rewind into the last decode then costs nothing and needs no
checkpoint; `Rollback.cut` uses it only where it is exact (within the last decode, once per decode, and never to
the state before the decode's first token, which llama.cpp does not keep).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import llama_cpp
import numpy as np

SLOTS = 3  # checkpoints kept at once: the verify round's (or a drafter's), the prompt's end, a measurement's
RS_DEPTH = 8  # per-token snapshots asked of llama.cpp where it allows them (the adaptive γ range's top)
PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
METHODS = ("seq", "host")


def memory_kind(model: ctypes.c_void_p) -> str:
    """"attention", "recurrent" or "hybrid", as llama.cpp classifies the model (not by architecture name)."""
    if llama_cpp.llama_model_is_recurrent(model):
        return "recurrent"
    if llama_cpp.llama_model_is_hybrid(model):
        return "hybrid"
    return "attention"


@dataclass(frozen=True)
class RollbackInfo:
    """What `models show`, `run --verbose` and the bench say about a model's rollback."""

    kind: str  # attention, recurrent, hybrid
    method: str  # "cut" (attention), "seq" or "host"
    rs_depth: int = 0  # llama.cpp's per-token snapshots (0: none)
    timings_ms: dict[str, tuple[float, float]] = field(default_factory=dict)  # method -> (save, restore) ms

    def describe(self) -> str:
        if self.kind == "attention":
            return "attention (KV cache cut in place)"
        rs = f" + llama.cpp's per-token snapshots of the last {self.rs_depth}" if self.rs_depth else ""
        times = ", ".join(f"{m} {s:.3f}+{r:.3f} ms" for m, (s, r) in self.timings_ms.items())
        return f"{self.kind} (checkpoints in {self.method}{rs}; save+restore measured: {times})"


class _SeqStore:
    """Checkpoints in spare sequences 1..SLOTS of the context."""

    method = "seq"

    def __init__(self, ctx: ctypes.c_void_p) -> None:
        self.mem = llama_cpp.llama_get_memory(ctx)

    def save(self, slot: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, slot + 1, -1, -1)
        llama_cpp.llama_memory_seq_cp(self.mem, 0, slot + 1, -1, -1)

    def load(self, slot: int, position: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, 0, -1, -1)
        llama_cpp.llama_memory_seq_cp(self.mem, slot + 1, 0, -1, -1)

    def drop(self, slot: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, slot + 1, -1, -1)


class _HostStore:
    """Checkpoints as host copies of sequence 0's recurrent state."""

    method = "host"

    def __init__(self, ctx: ctypes.c_void_p) -> None:
        self.ctx, self.mem = ctx, llama_cpp.llama_get_memory(ctx)
        self.saved: dict[int, ctypes.Array] = {}

    def save(self, slot: int) -> None:
        size = llama_cpp.llama_state_seq_get_size_ext(self.ctx, 0, PARTIAL)
        buf = self.saved.get(slot)
        if buf is None or len(buf) < size:
            buf = self.saved[slot] = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self.ctx, buf, size, 0, PARTIAL) != size:
            raise RuntimeError("llama.cpp could not copy the recurrent state")

    def load(self, slot: int, position: int) -> None:
        buf = self.saved[slot]
        if llama_cpp.llama_state_seq_set_data_ext(self.ctx, buf, len(buf), 0, PARTIAL) == 0:
            raise RuntimeError("llama.cpp could not restore the recurrent state")
        # the recurrent part now ends at position - 1; a hybrid's attention part still holds what followed
        if not llama_cpp.llama_memory_seq_rm(self.mem, 0, position, -1):
            raise RuntimeError(f"llama.cpp could not cut the attention cache at {position} after a restore")

    def drop(self, slot: int) -> None:
        self.saved.pop(slot, None)


@dataclass
class _Checkpoint:
    position: int
    slot: int


class Rollback:
    """The checkpoints of one context's sequence 0, by tag (one per tag: a new one replaces the old)."""

    def __init__(self, ctx: ctypes.c_void_p, info: RollbackInfo) -> None:
        self.info = info
        self.mem = llama_cpp.llama_get_memory(ctx)
        self.store: _SeqStore | _HostStore = _SeqStore(ctx) if info.method == "seq" else _HostStore(ctx)
        self.checkpoints: dict[str, _Checkpoint] = {}
        self.rs_window = 0  # how far back llama.cpp's snapshots of the last decode can go now
        self.saves = self.restores = self.replayed = 0  # counts, for the stats and the tests

    def after_decode(self, n_last_chunk: int) -> None:
        """A decode's last chunk ran: its snapshots cover rewinds of up to len - 1 tokens (not its first)."""
        self.rs_window = min(self.info.rs_depth, n_last_chunk - 1)

    def save(self, tag: str, position: int, *, ahead: int = 0, keep_last: bool = False) -> None:
        """Remember the state at `position` (the model's n_past now). `ahead`: the next decode will be a batch
        from which a rewind of at most this many tokens back from its end follows; llama.cpp's own snapshots
        cover it where they reach that far, and no copy is made. `keep_last`: the checkpoint this one replaces
        stays too, as `tag + ".last"` (a conversation's follow-up and a second answer to its last prompt)."""
        if 0 < ahead <= self.info.rs_depth:
            return
        old = self.checkpoints.get(tag)
        if old is not None and old.position == position:
            return
        if old is not None and keep_last and old.position < position:
            last = self.checkpoints.pop(tag + ".last", None)
            if last is not None:
                self.store.drop(last.slot)
            self.checkpoints[tag + ".last"] = self.checkpoints.pop(tag)
            old = None
        slot = old.slot if old is not None else self._free_slot()
        self.store.save(slot)
        self.checkpoints[tag] = _Checkpoint(position, slot)
        self.saves += 1

    def _free_slot(self) -> int:
        used = {c.slot for c in self.checkpoints.values()}
        free = [s for s in range(SLOTS) if s not in used]
        if free:
            return free[0]
        oldest = min(self.checkpoints, key=lambda t: self.checkpoints[t].position)  # the least likely to be wanted
        return self.checkpoints.pop(oldest).slot

    def cut(self, n_past: int, n: int) -> int:
        """Go back from n_past to the latest point <= n that needs no replay; returns it (0: cleared). Every
        checkpoint past n is forgotten: the tokens after n are about to change."""
        back = n_past - n
        if 0 < back <= self.rs_window and llama_cpp.llama_memory_seq_rm(self.mem, 0, n, -1):
            self.rs_window = 0  # llama.cpp's rollback is single-use until the next decode
            self._forget_after(n)
            return n
        self.rs_window = 0
        self._forget_after(n)
        best = max((c for c in self.checkpoints.values()), key=lambda c: c.position, default=None)
        if best is None or best.position == 0:
            llama_cpp.llama_memory_seq_rm(self.mem, 0, -1, -1)
            return 0
        self.store.load(best.slot, best.position)
        self.restores += 1
        return best.position

    def _forget_after(self, n: int) -> None:
        for tag in [t for t, c in self.checkpoints.items() if c.position > n]:
            self.store.drop(self.checkpoints.pop(tag).slot)

    def clear(self) -> None:
        for tag in list(self.checkpoints):
            self.store.drop(self.checkpoints.pop(tag).slot)
        self.rs_window = 0


class Decoder(Protocol):
    """What `choose` times a model through: its context, its tokens and a decode (backend.Model is one)."""

    tokens: list[int]

    @property
    def ctx_pointer(self) -> Any: ...

    @property
    def n_past(self) -> int: ...

    def decode(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray: ...


def choose(model: Decoder, kind: str, probe: Sequence[int], repeats: int = 7) -> RollbackInfo:
    """Time a save and a restore of each method on this model and backend, from an empty cache, and keep the
    faster. "seq" copies the state on the device at the next decode, so each timing includes that decode and
    has a plain decode's time taken off. The cache is left empty."""
    ctx = model.ctx_pointer
    rs = int(llama_cpp.llama_n_rs_seq(ctx))
    timings: dict[str, tuple[float, float]] = {}
    one = list(probe[:1])
    # with llama.cpp's snapshots, a state just rolled back lives in a snapshot plane until the next decode: a host
    # copy reads it from there, a spare sequence would share the cell's stale current plane instead
    spare = int(llama_cpp.llama_n_seq_max(ctx)) > SLOTS and rs == 0
    for method in METHODS if spare else ("host",):
        store: _SeqStore | _HostStore = _SeqStore(ctx) if method == "seq" else _HostStore(ctx)
        model.decode(list(probe), 0)
        with_save, with_restore, plain = [], [], []
        for _ in range(repeats):
            position = model.n_past
            t0 = time.perf_counter()
            store.save(0)
            model.decode(one, 1)
            t1 = time.perf_counter()
            store.load(0, position)
            del model.tokens[position:]
            model.decode(one, 1)
            t2 = time.perf_counter()
            model.decode(one, 1)
            t3 = time.perf_counter()
            with_save.append(t1 - t0)
            with_restore.append(t2 - t1)
            plain.append(t3 - t2)
        save, restore = min(with_save) - min(plain), min(with_restore) - min(plain)
        store.drop(0)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, -1, -1)
        model.tokens.clear()
        timings[method] = (1e3 * max(save, 0.0), 1e3 * max(restore, 0.0))
    method = min(timings, key=lambda m: sum(timings[m]))
    return RollbackInfo(kind, method, rs, timings)
