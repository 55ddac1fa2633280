"""The only module that imports llama_cpp.

A `Model` is one GGUF loaded with one llama context (one sequence, batch 1). It knows which tokens are in
its KV cache (`tokens`), decodes a batch at the end of that cache and returns logits only for the rows asked
for, and rewinds the cache to any earlier length. Nothing here knows about drafting or sampling.

Invariant: `len(self.tokens)` is the KV cache length `n_past`, and `self.tokens[i]` sits at position i.

Threads: decode a model from one thread at a time, and prefer one thread for its whole life. llama.cpp's CPU
backend (OpenMP builds) keeps a thread pool per calling thread for as long as that thread lives; with two live
pools on a small machine libgomp throttles its spin-waiting and decoding gets ~2x slower (measured: SmolLM2-135M,
2 cores, 180 -> 95 tok/s). One-shot compute on a thread that will not decode again (load-time calibration on the
main thread of a server) therefore runs through `in_own_thread`, whose pool dies with it. How many threads a
decode uses is the thread controller's choice (threads.py), applied between decodes by `set_threads`; OpenMP's
wait policy is fixed when llama.cpp loads, so it is set (threads.openmp_defaults) before the import below.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from .threads import cpu_count, openmp_defaults

openmp_defaults()  # before llama.cpp loads its OpenMP runtime, which reads the wait policy once

import llama_cpp  # noqa: E402
from llama_cpp import _internals, _logger  # noqa: E402

from . import rpc  # noqa: E402
from .errors import ContextOverflow, LocalspecError, ModelLoadError  # noqa: E402

_GGUF_MAGIC = b"GGUF"
T = TypeVar("T")
_backend_ready = False


_verbose = False


@llama_cpp.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log goes to stderr only with --verbose: our errors are one line of our own."""
    if _verbose:
        sys.stderr.write(text.decode("utf-8", "replace"))


def _init_backend(verbose: bool) -> None:
    global _backend_ready, _verbose
    _verbose = verbose
    _logger.set_verbose(verbose)
    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


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


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", "replace")


def build_info() -> str:
    """Which llama.cpp this is (calibration results are cached per build): package version + CPU features."""
    return f"llama-cpp-python {llama_cpp.__version__}; {system_info().strip()}"


# -- devices and RPC (ggml's backend registry, through the libggml that libllama uses) -----------------------------
#
# Which devices a model's offloaded layers (and their KV cache) go to is llama.cpp's `llama_model_params.devices`,
# a NULL-terminated ggml_backend_dev_t array. NULL means llama.cpp's default: every registered device of type GPU,
# RPC ones first ("to minimize network transfers"), then local GPUs, then integrated GPUs if there is no discrete
# one (src/llama.cpp, llama_prepare_model_devices). localspec passes NULL unless an RPC server is registered in
# this process; then it passes the same list restricted to the RPC servers this model asked for, so a drafter
# loaded without --rpc stays local. --tensor-split proportions follow that order: RPC devices, then local GPUs.

_DEV_TYPES = ("CPU", "GPU", "IGPU", "ACCEL", "META")  # enum ggml_backend_dev_type
_rpc_devices: dict[str, list[int]] = {}  # endpoint -> its ggml devices, in registration order


class _DevProps(ctypes.Structure):
    """struct ggml_backend_dev_props up to device_id; `caps` is over-sized so a newer ggml cannot overrun it."""

    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", ctypes.c_bool * 32)]


@functools.lru_cache(maxsize=None)
def _ggml() -> ctypes.CDLL:
    """libggml as libllama loaded it. A wheel stores libggml.so and libggml.so.0 as two files, and
    llama_cpp._ggml loads the first: a second backend registry that llama.cpp never reads (why --rpc devices
    were once registered but never used). Loading libllama's soname returns libllama's own copy."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    sonames = sorted([*lib.glob("libggml.so.[0-9]*"), *lib.glob("libggml.[0-9]*.dylib")], key=lambda p: len(p.name))
    if sonames:  # libggml.so.0 before libggml.so.0.25.3
        g = ctypes.CDLL(str(sonames[0]))
    else:
        from llama_cpp._ggml import libggml as g
    c, vp = ctypes, ctypes.c_void_p
    for name, res, args in (
            ("ggml_backend_dev_count", c.c_size_t, []), ("ggml_backend_dev_get", vp, [c.c_size_t]),
            ("ggml_backend_dev_name", c.c_char_p, [vp]), ("ggml_backend_dev_description", c.c_char_p, [vp]),
            ("ggml_backend_dev_type", c.c_int, [vp]), ("ggml_backend_dev_backend_reg", vp, [vp]),
            ("ggml_backend_dev_memory", None, [vp, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)]),
            ("ggml_backend_dev_get_props", None, [vp, c.POINTER(_DevProps)]),
            ("ggml_backend_reg_name", c.c_char_p, [vp]), ("ggml_backend_reg_by_name", vp, [c.c_char_p]),
            ("ggml_backend_reg_dev_count", c.c_size_t, [vp]), ("ggml_backend_reg_dev_get", vp, [vp, c.c_size_t]),
            ("ggml_backend_reg_get_proc_address", vp, [vp, c.c_char_p]), ("ggml_backend_register", None, [vp])):
        f = getattr(g, name)
        f.restype, f.argtypes = res, args
    return g


def supports_rpc() -> bool:
    return bool(llama_cpp.llama_supports_rpc())


def _memory(g, d: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def _describe(g, d: int) -> dict:
    free, total = _memory(g, d)
    return {"name": g.ggml_backend_dev_name(d).decode(), "description": g.ggml_backend_dev_description(d).decode(),
            "type": _DEV_TYPES[g.ggml_backend_dev_type(d)],
            "backend": g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(d)).decode(),
            "free": free, "total": total}


def devices() -> list[dict]:
    """ggml's devices (CPU, CUDA0, Metal, RPC0 = a server added by --rpc, ...) with their memory in bytes.
    An RPC device's memory is what its server reports (one round trip)."""
    _init_backend(_verbose)
    g = _ggml()
    return [_describe(g, g.ggml_backend_dev_get(i)) for i in range(g.ggml_backend_dev_count())]


def add_rpc_servers(endpoints: Sequence[str], *, timeout: float = rpc.PROBE_TIMEOUT_S) -> list[dict]:
    """Register remote ggml-rpc-server devices as llama.cpp's --rpc does (ggml_backend_rpc_add_server), after
    probing each endpoint (llama.cpp's client aborts the process on a dead one). Returns their devices.

    llama-cpp-python 0.3.36 has no rpc_servers parameter; the RPC backend exposes this through ggml's registry.
    """
    if not supports_rpc():
        raise ModelLoadError("--rpc needs llama-cpp-python built with the RPC backend: "
                             'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
                             "llama-cpp-python (see docs/models.md)")
    eps = [str(e) for e in rpc.parse_endpoints(endpoints)]
    _init_backend(_verbose)
    g = _ggml()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    fn = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not fn:
        raise ModelLoadError("this llama.cpp build's RPC backend has no ggml_backend_rpc_add_server; "
                             "update llama-cpp-python")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(fn)
    for ep in eps:
        if ep not in _rpc_devices:
            rpc.probe(rpc.parse_endpoint(ep), timeout)
            _rpc_devices[ep] = _register(g, add_server, ep)
    out = [_describe(g, d) for ep in eps for d in _rpc_devices[ep]]
    empty = [d for d in out if d["total"] == 0]
    if empty:
        raise ModelLoadError(f"--rpc {empty[0]['description']}: the rpc server reports no memory on "
                             f"{empty[0]['name']}; restart ggml-rpc-server")
    return out


def serve_rpc(endpoint: str, n_threads: int = 1) -> None:
    """Serve this machine's CPU as an RPC device at `endpoint`, forever: what ggml-rpc-server does without
    accelerators (the same ggml_backend_rpc_start_server), for tests on machines without that binary."""
    _init_backend(_verbose)
    g = _ggml()
    fn = g.ggml_backend_reg_get_proc_address(g.ggml_backend_reg_by_name(b"RPC"), b"ggml_backend_rpc_start_server")
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_void_p))(fn)
    cpu = next(d for d in (g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count()))
               if g.ggml_backend_dev_type(d) == _DEV_TYPES.index("CPU"))
    start(endpoint.encode(), None, n_threads, 1, (ctypes.c_void_p * 1)(cpu))


def _register(g, add_server, ep: str) -> list[int]:
    reg = add_server(ep.encode())
    if not reg:
        raise ModelLoadError(f"--rpc {ep}: the rpc server has no devices; restart ggml-rpc-server with a backend")
    g.ggml_backend_register(reg)
    return [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]


def _offload_devices(rpc_servers: Sequence[str]) -> list[int]:
    """llama.cpp's default device choice (see above), with only these RPC servers' devices, in --rpc order."""
    g = _ggml()
    gpus: list[int] = []
    igpus: list[int] = []
    seen_ids: set[bytes] = set()
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        kind = _DEV_TYPES[g.ggml_backend_dev_type(d)]
        backend = g.ggml_backend_dev_backend_reg(d)
        if kind == "GPU" and g.ggml_backend_reg_name(backend) != b"RPC":
            props = _DevProps()
            g.ggml_backend_dev_get_props(d, ctypes.byref(props))
            if props.device_id and props.device_id in seen_ids:
                continue  # one GPU seen by two backends (e.g. CUDA and Vulkan): llama.cpp keeps the first
            seen_ids.add(props.device_id or b"")
            gpus.append(d)
        elif kind == "IGPU" and (not igpus or backend == g.ggml_backend_dev_backend_reg(igpus[-1])):
            igpus.append(d)
    remote = [d for ep in (str(e) for e in rpc.parse_endpoints(rpc_servers)) for d in _rpc_devices.get(ep, [])]
    return remote + gpus + ([] if gpus else igpus)


def _devices_param(rpc_servers: Sequence[str]):
    """(value for llama_model_params.devices or None for llama.cpp's default, the device names used)."""
    g = _ggml()
    chosen = _offload_devices(rpc_servers)
    names = tuple(g.ggml_backend_dev_name(d).decode() for d in chosen)
    if not _rpc_devices:
        return None, names
    return (ctypes.c_void_p * (len(chosen) + 1))(*chosen, None), names


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: the knobs llama.cpp exposes per model (target and drafter separately)."""

    n_ctx: int = 4096
    n_threads: int | None = None
    n_batch: int = 512
    n_gpu_layers: int = 0  # -1 = all
    main_gpu: int = 0
    tensor_split: tuple[float, ...] | None = None
    flash_attn: bool | None = None  # None = llama.cpp decides
    type_k: int | None = None
    type_v: int | None = None
    verbose: bool = False
    rpc_servers: tuple[str, ...] = ()  # "host:port" of ggml-rpc-server processes (needs a GGML_RPC=on build)

    def local(self) -> "LoadOptions":
        """These options without the RPC servers, for a drafter: it runs γ times a round, so a network hop per
        draft token would cost more than drafting saves. A split meant for RPC + local devices goes too."""
        return replace(self, rpc_servers=(), tensor_split=None if self.rpc_servers else self.tensor_split)


def check_gguf_file(path: str | Path) -> Path:
    """Refuse a missing, non-GGUF or truncated file with a one-line reason, before llama.cpp sees it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelLoadError(f"not a file: {p}")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{p} is not a GGUF file (magic {magic!r}, expected b'GGUF'); "
                             "convert it with llama.cpp's convert_hf_to_gguf.py or download a .gguf")
    return p


def _check_not_truncated(p: Path) -> None:
    """Read the header with the gguf package; it fails fast when tensor data runs past the end of the file."""
    from gguf import GGUFReader

    try:
        r = GGUFReader(str(p))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in r.tensors), default=0)
        if end > p.stat().st_size:
            raise ValueError(f"tensor data ends at byte {end}, file has {p.stat().st_size}")
    except Exception as e:  # gguf raises ValueError/IndexError/struct errors on damaged files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(f"{p} is a damaged or truncated GGUF ({msg}); download it again") from None


def _new_context(model: _internals.LlamaModel, p: Path, options: LoadOptions) -> _internals.LlamaContext:
    """A llama context for one sequence. Threads: all cores until the thread controller (threads.py) sets them
    per round; flash attention: as calibrated (None = llama.cpp's auto)."""
    threads = options.n_threads or cpu_count()
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = options.n_ctx
    cparams.n_batch = options.n_batch
    cparams.n_ubatch = options.n_batch
    cparams.n_seq_max = 1
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.no_perf = True
    cparams.swa_full = True  # we rewind the cache every round; a pruned sliding window could not be restored
    if options.flash_attn is not None:
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if options.flash_attn
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    if options.type_k is not None:
        cparams.type_k = options.type_k
    if options.type_v is not None:
        cparams.type_v = options.type_v
    try:
        return _internals.LlamaContext(model=model, params=cparams, verbose=options.verbose)
    except ValueError as e:
        raise ModelLoadError(f"could not create a context for {p} (n_ctx={options.n_ctx}): {e}") from None


@dataclass
class Model:
    """A loaded GGUF with its KV cache; see the module docstring for the `tokens` invariant."""

    path: Path
    options: LoadOptions
    _model: _internals.LlamaModel = field(repr=False)
    _ctx: _internals.LlamaContext = field(repr=False)
    _batch: ctypes.Structure = field(repr=False)
    tokens: list[int] = field(default_factory=list)
    offload_devices: tuple[str, ...] = ()  # ggml devices its offloaded layers may use (RPC first); () = CPU
    _pieces: dict[int, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | Path, options: LoadOptions = LoadOptions()) -> "Model":
        p = check_gguf_file(path)
        _init_backend(options.verbose)
        if options.rpc_servers:
            add_rpc_servers(options.rpc_servers)
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = -1 if options.n_gpu_layers < 0 else options.n_gpu_layers  # llama.h: < 0 = all
        mparams.main_gpu = options.main_gpu
        devs, dev_names = _devices_param(options.rpc_servers)
        if devs is not None:
            mparams.devices = ctypes.cast(devs, ctypes.c_void_p)
        split = None
        if options.tensor_split:
            split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*options.tensor_split)
            mparams.tensor_split = split
        try:
            model = _internals.LlamaModel(path_model=str(p), params=mparams, verbose=options.verbose)
        except ValueError:
            _check_not_truncated(p)  # a precise reason when the header or data is damaged
            raise ModelLoadError(f"llama.cpp could not load {p}: unsupported architecture or damaged file "
                                 "(rerun with --verbose to see llama.cpp's log)") from None
        ctx = _new_context(model, p, options)
        # llama.cpp may clamp n_batch to n_ctx (and pad n_ctx): chunk by what the context really accepts
        options = replace(options, n_batch=int(llama_cpp.llama_n_batch(ctx.ctx)))
        batch = llama_cpp.llama_batch_init(options.n_batch, 0, 1)
        m = cls(path=p, options=options, _model=model, _ctx=ctx, _batch=batch,
                offload_devices=dev_names if options.n_gpu_layers else ())
        m._keep = (split, devs)  # the C side holds pointers to them
        return m

    # -- vocabulary facts -------------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab()

    @property
    def n_ctx(self) -> int:
        return self._ctx.n_ctx()

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
    def add_bos(self) -> bool:
        return bool(self._model.add_bos_token())

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and friends (llama.cpp's own list)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    def token_text(self, token: int) -> str:
        return self._model.token_get_text(token)

    def metadata(self) -> dict[str, str]:
        return self._model.metadata()

    def describe(self) -> str:
        return self._model.desc()

    # -- text <-> tokens --------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_special, parse_special)

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
        """Takes effect at the next decode; cheap (the thread controller calls it between rounds)."""
        llama_cpp.llama_set_n_threads(self._ctx.ctx, n_threads, n_threads_batch)

    def set_flash_attn(self, on: bool | None) -> None:
        """Rebuild the context with flash attention on/off (None = llama.cpp's auto). Empties the KV cache."""
        if on == self.options.flash_attn:
            return
        threads = self.threads
        self._ctx.close()
        self.options = replace(self.options, flash_attn=on)
        self._ctx = _new_context(self._model, self.path, self.options)
        self.set_threads(*threads)
        self.tokens.clear()

    # -- the KV cache -----------------------------------------------------------------------------------------

    def rewind(self, n_past: int) -> None:
        """Drop every cached position >= n_past."""
        if n_past >= len(self.tokens):
            return
        mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        ok = llama_cpp.llama_memory_seq_rm(mem, 0, n_past, -1)
        if not ok:  # recurrent models cannot drop a suffix: start over
            llama_cpp.llama_memory_clear(mem, True)
            n_past = 0
        del self.tokens[n_past:]

    def decode(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        """Append `tokens` to the cache; return float32 logits [logits_rows, n_vocab] of the LAST rows.

        Only those rows are computed by the output layer (never logits_all). The returned array is a copy:
        llama.cpp reuses its buffer on the next decode.
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
        ptr = llama_cpp.llama_get_logits(self._ctx.ctx)
        rows = np.ctypeslib.as_array(ptr, shape=(logits_rows, self.n_vocab))
        return rows.copy()

    def _decode_chunk(self, chunk: Sequence[int], first_out: int) -> None:
        b = self._batch
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

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()
        self._model.close()


# -- grammars (llama.cpp's GBNF engine, for constrained decoding) ------------------------------------------------

class GrammarError(LocalspecError):
    """A GBNF grammar or JSON schema that llama.cpp cannot use."""

    exit_code = 2


def json_schema_grammar(schema: dict) -> str:
    """A JSON schema -> GBNF, with llama-cpp-python's port of llama.cpp's json-schema-to-grammar."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter raises whatever it trips on (KeyError, ValueError, TypeError, ...)
        raise GrammarError(f"cannot use this JSON schema: {type(e).__name__}: {e}") from None


class Grammar:
    """One state of a GBNF grammar over `model`'s vocabulary: which tokens may come next (`mask`, `allows`),
    and the state after a token (`accept`, on a `clone` to keep this one). Wraps llama.cpp's grammar sampler.

    `accept` must only see allowed tokens: llama.cpp aborts the process on a token its grammar rejects, so
    callers check `allows` first (constrain.py does)."""

    def __init__(self, model: "Model", gbnf: str, root: str = "root", *, _smpl: Any = None) -> None:
        self._vocab = model._model.vocab
        self.n_vocab = model.n_vocab
        if _smpl is None:
            _smpl = llama_cpp.llama_sampler_init_grammar(self._vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
            if not _smpl:
                raise GrammarError("llama.cpp could not parse the grammar (GBNF syntax, or no rule "
                                   f"'{root}'); check it with llama.cpp's grammar docs")
        self._smpl = _smpl
        self._model = model  # keeps the vocabulary alive as long as this state
        self._one, self._full = _TokenArray(1), _TokenArray(self.n_vocab)  # scratch, shared with clones

    def clone(self) -> "Grammar":
        g = Grammar.__new__(Grammar)
        g._vocab, g.n_vocab, g._model, g._one, g._full = self._vocab, self.n_vocab, self._model, self._one, self._full
        g._smpl = llama_cpp.llama_sampler_clone(self._smpl)
        return g

    def mask(self) -> np.ndarray:
        """bool [n_vocab]: True where the grammar allows the token next (end-of-generation only when complete)."""
        a = self._full
        a.data.logit[:] = 0.0
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(a.c))
        return np.isfinite(a.data.logit)

    def allows(self, token: int) -> bool:
        a = self._one
        a.data.id[0], a.data.logit[0] = token, 0.0
        a.c.size = 1
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(a.c))
        return bool(np.isfinite(a.data.logit[0]))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._smpl, token)

    def close(self) -> None:
        if getattr(self, "_smpl", None):
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    __del__ = close


class _TokenArray:
    """A llama_token_data_array over numpy storage: ids 0..n-1, logits 0 (the grammar only sets -inf)."""

    def __init__(self, n: int) -> None:
        self.data = np.recarray((n,), dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)],
                                                    align=True))
        self.data.id[:] = np.arange(n, dtype=np.intc)
        self.data.logit[:] = 0.0
        self.data.p[:] = 0.0
        self.c = llama_cpp.llama_token_data_array(data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                  size=n, selected=-1, sorted=False)
