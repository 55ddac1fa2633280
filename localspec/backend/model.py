"""One GGUF model and its llama context: load, tokenize, decode, rewind, thread and flash-attention settings.
(How to load: loading.py.)

A `Model` is one GGUF loaded with one llama context (one sequence, batch 1). It knows which tokens are in
its KV cache (`tokens`), decodes a batch at the end of that cache and returns logits only for the rows asked
for, and rewinds the cache to any earlier length. Nothing here knows about drafting or sampling.

Invariant: `len(self.tokens)` is the KV cache length `n_past`, and `self.tokens[i]` sits at position i.

Threads: decode a model from one thread at a time, and prefer one thread for its whole life. llama.cpp's CPU
backend (OpenMP builds) keeps a thread pool per calling thread for as long as that thread lives; with two live
pools on a small machine libgomp throttles its spin-waiting and decoding slows down
(docs/bench/threads.md#thread-numbers). One-shot compute on a thread that will not decode again
(load-time calibration on the main thread of a server) therefore runs through `in_own_thread`, whose pool dies
with it. How many threads a decode uses is the thread controller's choice (threads.py), applied between
decodes by `set_threads`; OpenMP's wait policy is fixed when llama.cpp loads, and localspec leaves it at
libgomp's default (machine.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import llama_cpp
import numpy as np
from llama_cpp import _internals

from ..errors import ContextOverflow
from . import fastpath
from .fastpath import FastPath
from .ggml import _devices_param, _init_backend, add_rpc_servers
from .loading import LoadOptions, check_gguf_file, load_weights, new_context, place_weights
from .rollback import Rollback, RollbackInfo, memory_kind
from .rollback import choose as choose_rollback

TOKENIZED_KEPT = 64  # texts whose tokens Model.tokenize remembers (a prefix, a suffix, 16 extra chunks, ...)
TOKENIZED_MIN_CHARS = 256  # shorter texts (a cursor line) are cheap to tokenize again and would only evict
T = TypeVar("T")


def in_own_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run fn in a short-lived thread and return its result (or raise its exception); see "Threads" above."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=target, name="localspec-oneshot")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _address_of(name: str) -> Callable[..., int]:
    """A private binding of a llama.cpp getter that returns a pointer as a plain int: the package's own binding
    returns a ctypes pointer object that must then be cast, two objects per call on the per-token path. A new
    function object (`lib[name]`, not `lib.name`), so the package's binding keeps its restype."""
    fn = llama_cpp.llama_cpp._lib[name]
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_void_p
    return fn


_logits_address = _address_of("llama_get_logits")


@dataclass
class Model:
    """A loaded GGUF with its KV cache; see the module docstring for the `tokens` invariant."""

    path: Path
    options: LoadOptions
    _model: _internals.LlamaModel = field(repr=False)
    _ctx: _internals.LlamaContext = field(repr=False)
    _batch: ctypes.Structure | None = field(repr=False)  # None once closed
    tokens: list[int] = field(default_factory=list)
    offload_devices: tuple[str, ...] = ()  # ggml devices its offloaded layers may use (RPC first); () = CPU
    weights: str = "mmap"  # where the weights were loaded: "mmap" (llama.cpp's choice) or "read" (memory.py)
    fast_path: FastPath = field(default_factory=FastPath)  # which extra CPU buffer types it uses, and why
    _pieces: dict[int, bytes] = field(default_factory=dict, repr=False)
    _tokenized: OrderedDict[tuple[str, bool, bool], tuple[int, ...]] = field(default_factory=OrderedDict,
                                                                              repr=False, compare=False)
    _tokenized_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _views: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)  # see _logits_view
    _eog: dict[int, bool] = field(default_factory=dict, repr=False)
    _n_vocab: int = field(default=0, repr=False)  # set by load: fixed per model ...
    _n_ctx: int = field(default=0, repr=False)  # ... and per context
    _threads_set: tuple[int, int] | None = field(default=None, repr=False)  # what set_threads last gave llama.cpp
    _keep: tuple[object, ...] = field(default=(), repr=False, compare=False)  # the C side points into these
    rollback_info: RollbackInfo = field(default_factory=lambda: RollbackInfo("attention", "cut"))
    _rollback: Rollback | None = field(default=None, repr=False)  # None: the cache cuts in place (attention)
    # called after each decoded chunk with (its first position, its length): an MTP head reads the hidden states
    # of those positions before the next decode overwrites them (mtp.py)
    on_decode: Callable[[int, int], None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path, options: LoadOptions = LoadOptions()) -> "Model":
        p = check_gguf_file(path)
        _init_backend(options.verbose)
        if options.rpc_servers:
            add_rpc_servers(options.rpc_servers)
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = -1 if options.n_gpu_layers < 0 else options.n_gpu_layers  # llama.h: < 0 = all
        mparams.main_gpu = options.main_gpu
        mparams.load_mtp = options.mtp  # the GGUF's MTP (nextn) heads, where it has them (mtp.py)
        devs, dev_names = _devices_param(options.rpc_servers)
        if devs is not None:
            mparams.devices = ctypes.cast(devs, ctypes.c_void_p)
        split = None
        if options.tensor_split:
            split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*options.tensor_split)
            mparams.tensor_split = split
        weights, advisor = place_weights(mparams, p, options)
        # the fast-path trial (a child) runs while this process loads and decodes the reference: crashes at compute
        choice = fastpath.begin(p, mode=options.fast_path, n_threads=options.n_threads,
                                n_gpu_layers=options.n_gpu_layers, verbose=options.verbose)
        overrides = fastpath.apply(mparams, choice.guess)
        try:
            model = load_weights(p, mparams, options)
        except BaseException:
            choice.cancel()
            raise
        plan = choice.finish()
        if plan.mode != choice.guess.mode:  # its trial failed: load again without what failed
            model.close()
            overrides = fastpath.apply(mparams, plan)
            model = load_weights(p, mparams, options)
        kind = memory_kind(model.model)
        ctx = new_context(model, p, options, recurrent=kind != "attention")
        # llama.cpp may clamp n_batch to n_ctx (and pad n_ctx): chunk by what the context really accepts
        options = replace(options, n_batch=int(llama_cpp.llama_n_batch(ctx.ctx)))
        batch = llama_cpp.llama_batch_init(options.n_batch, 0, 1)
        m = cls(path=p, options=options, _model=model, _ctx=ctx, _batch=batch,
                offload_devices=dev_names if options.n_gpu_layers else (), weights=weights, fast_path=plan)
        m._keep = (split, devs, advisor, overrides)  # the C side holds pointers to them
        # asked every round and fixed per context: read once (a ctypes call costs ~10x its warm time after a decode)
        m._n_vocab, m._n_ctx = model.n_vocab(), ctx.n_ctx()
        if kind != "attention":
            m.rollback_info = choose_rollback(m, kind, m.tokenize("The quick brown fox jumps", add_special=True))
            m._rollback = Rollback(m.ctx_pointer, m.rollback_info)
        return m

    # -- vocabulary facts -------------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def bos(self) -> int:
        return self._model.token_bos()

    @property
    def eos(self) -> int:
        return self._model.token_eos()

    @property
    def eot(self) -> int:
        """End of turn, else EOS: the token llama.cpp's infill sampler falls back to (sampling/infill.py)."""
        eot = self._model.token_eot()
        return eot if eot >= 0 else self.eos

    @property
    def add_bos(self) -> bool:
        return bool(self._model.add_bos_token())

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and friends (llama.cpp's own list); cached per token."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))
        return eog

    def token_text(self, token: int) -> str:
        return self._model.token_get_text(token)

    @property
    def model_pointer(self) -> Any:
        """The llama model, for backend modules that make another context on it (mtp.py)."""
        return self._model.model

    @property
    def ctx_pointer(self) -> Any:
        """The llama context, for backend modules that call llama.cpp on it (rollback.py)."""
        return self._ctx.ctx

    @property
    def context(self) -> object:
        """The llama context's wrapper: a new object whenever the context is rebuilt (set_flash_attn), where a
        new llama context may reuse the old one's address. A reader that set flags on it (eagle3.py) holds it."""
        return self._ctx

    @property
    def cuts_in_place(self) -> bool:
        """Whether a rewind only drops cache entries (attention), or restores a checkpoint (rollback.py)."""
        return self._rollback is None

    @property
    def memory_kind(self) -> str:
        """attention, recurrent or hybrid: whether the cache can be cut in place (rollback.py)."""
        return self.rollback_info.kind

    def metadata(self) -> dict[str, str]:
        return self._model.metadata()

    def describe(self) -> str:
        return self._model.desc()

    # -- text <-> tokens --------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Text -> tokens. The last TOKENIZED_KEPT long texts are remembered: an editor sends the same prefix,
        suffix and extra chunks on every key, and llama.cpp's tokenizer takes milliseconds per 10 KB of them."""
        if len(text) < TOKENIZED_MIN_CHARS:
            return self._model.tokenize(text.encode("utf-8"), add_special, parse_special)
        key = (text, add_special, parse_special)
        with self._tokenized_lock:  # the server tokenizes on its event loop too (/tokenize)
            hit = self._tokenized.get(key)
            if hit is not None:
                self._tokenized.move_to_end(key)
                return list(hit)
        tokens = self._model.tokenize(text.encode("utf-8"), add_special, parse_special)
        with self._tokenized_lock:
            self._tokenized[key] = tuple(tokens)
            if len(self._tokenized) > TOKENIZED_KEPT:
                self._tokenized.popitem(last=False)
        return tokens

    def piece(self, token: int) -> bytes:
        """Bytes of one token (special tokens render empty); cached, since the hot loop asks per token."""
        b = self._pieces.get(token)
        if b is None:
            buf = ctypes.create_string_buffer(256)
            n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buf, 256, 0, False)
            b = buf.raw[:max(n, 0)]
            self._pieces[token] = b
        return b

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    # -- threads and context settings (chosen by measurement: threads.py, costs.py) ----------------------------

    @property
    def threads(self) -> tuple[int, int]:
        """(n_threads, n_threads_batch): one-row decodes use the first, batches of 2+ rows the second."""
        c = self._ctx.ctx
        return int(llama_cpp.llama_n_threads(c)), int(llama_cpp.llama_n_threads_batch(c))

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Takes effect at the next decode. The thread controller calls it every round, so an unchanged count
        makes no ctypes call (~5 µs right after a decode); the count lives in this context, so engines sharing
        the model still see their own."""
        if self._threads_set == (n_threads, n_threads_batch):
            return
        llama_cpp.llama_set_n_threads(self._ctx.ctx, n_threads, n_threads_batch)
        self._threads_set = (n_threads, n_threads_batch)

    def set_flash_attn(self, on: bool | None) -> None:
        """Rebuild the context with flash attention on/off (None = llama.cpp's auto). Empties the KV cache."""
        if on == self.options.flash_attn:
            return
        threads = self.threads
        self._ctx.close()
        self._views.clear()
        self.options = replace(self.options, flash_attn=on)
        self._ctx = new_context(self._model, self.path, self.options, recurrent=self._rollback is not None)
        self._n_ctx = self._ctx.n_ctx()
        if self._rollback is not None:
            self._rollback = Rollback(self.ctx_pointer, self.rollback_info)
        self._threads_set = None  # a new context: set them again
        self.set_threads(*threads)
        self.tokens.clear()

    # -- the KV cache -----------------------------------------------------------------------------------------

    def rewind(self, n_past: int) -> None:
        """Drop every cached position >= n_past. Exact on every memory: a recurrent state is restored from the
        nearest checkpoint and the tokens after it are decoded again (rollback.py)."""
        if n_past >= len(self.tokens):
            return
        if self._rollback is None:
            self.restore(n_past)
            return
        kept = self._rollback.cut(len(self.tokens), n_past)
        replay = self.tokens[kept:n_past]
        del self.tokens[kept:]
        if replay:
            self.decode(replay, 0)
            self._rollback.replayed += len(replay)

    def restore(self, n_past: int) -> int:
        """Go back to the latest position <= n_past that needs no decoding again, and return it: n_past itself
        on an attention model, else a checkpoint, llama.cpp's own snapshot of the last decode, or 0. For callers
        that decode what follows anyway (a prefill, a drafter catching up): one batch instead of two."""
        if n_past >= len(self.tokens):
            return len(self.tokens)
        if self._rollback is None:
            if not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx.ctx), 0, n_past, -1):
                raise RuntimeError(f"llama.cpp could not cut the KV cache at {n_past} ({self.path.name})")
        else:
            n_past = self._rollback.cut(len(self.tokens), n_past)
        del self.tokens[n_past:]
        return n_past

    def checkpoint(self, tag: str, *, ahead: int = 0, keep_last: bool = False) -> None:
        """Remember the state here under `tag`, so that a later rewind to this point or past it is cheap; a no-op
        on an attention model. `ahead`: at most how far back from the end of the next decode a rewind will go
        (llama.cpp's per-token snapshots may cover it); `keep_last`: keep the one it replaces too (rollback.py)."""
        if self._rollback is not None:
            self._rollback.save(tag, len(self.tokens), ahead=ahead, keep_last=keep_last)

    @property
    def rollback_counts(self) -> dict[str, int]:
        """Checkpoints saved, restored and tokens decoded again so far (all 0 on an attention model)."""
        r = self._rollback
        return {"saves": r.saves, "restores": r.restores, "replayed": r.replayed} if r else \
            {"saves": 0, "restores": 0, "replayed": 0}

    def decode(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        """Append `tokens` to the cache; return float32 logits [logits_rows, n_vocab] of the LAST rows.

        Only those rows are computed by the output layer (never logits_all). The returned array is a read-only
        view of llama.cpp's logits buffer, not a copy (up to ~9 MB a verify round at a 262k vocabulary): it is
        valid until the next decode on this model (or set_flash_attn, or close), which overwrites or frees
        that buffer. Use it before then, and copy what you keep or write (sampling's `_patched` and
        constrain.py's rows do).
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("decode() needs at least one token")
        if not 0 <= logits_rows <= min(n, self.options.n_batch):
            raise ValueError(f"asked for {logits_rows} logit rows from {n} tokens (n_batch {self.options.n_batch})")
        if self.n_past + n > self.n_ctx:
            raise ContextOverflow(f"context full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}; "
                                  "raise --ctx or shorten the prompt")
        step = self.options.n_batch
        for start in range(0, n, step):
            chunk = tokens[start:start + step]
            first_out = n - logits_rows - start  # index in this chunk of the first row we want
            self._decode_chunk(chunk, first_out)
        if logits_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return self._logits_view(logits_rows)

    def _logits_view(self, rows: int) -> np.ndarray:
        """A read-only [rows, n_vocab] view of llama.cpp's logits buffer, made once per buffer address and row
        count: numpy's ctypes bridge costs ~35 µs a call right after a decode (cold caches), 1 % of a small
        model's token. The buffer only moves when llama.cpp grows it, and a moved one gets a new view."""
        address = _logits_address(self._ctx.ctx)
        key = (address, rows)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 64:
                self._views.clear()
            ptr = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))
            view.flags.writeable = False
            self._views[key] = view
        return view

    def _decode_chunk(self, chunk: Sequence[int], first_out: int) -> None:
        b = self._batch
        if b is None:
            raise RuntimeError(f"decode on a closed model ({self.path.name})")
        n_past = self.n_past
        for i, t in enumerate(chunk):
            b.token[i] = t
            b.pos[i] = n_past + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i >= first_out
        b.n_tokens = len(chunk)
        rc = llama_cpp.llama_decode(self._ctx.ctx, b)
        if rc == 1:
            raise ContextOverflow(f"no room in the KV cache at position {n_past} (n_ctx {self.n_ctx})")
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        self.tokens.extend(chunk)
        if self._rollback is not None:
            self._rollback.after_decode(len(chunk))
        if self.on_decode is not None:
            self.on_decode(n_past, len(chunk))

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()
        self._model.close()


