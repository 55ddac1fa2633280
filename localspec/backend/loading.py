"""How a GGUF is loaded: the options, the checks before llama.cpp sees the file, and the llama.cpp objects a load
builds (the context's parameters, where the weights go). `Model.load` (model.py) puts them together with the CPU
fast paths (fastpath.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals

from ..errors import ModelLoadError
from .ggml import supports_gpu_offload
from .machine import cpu_count
from .memory import huge_page_advisor, read_into_huge_pages
from .rollback import RS_DEPTH, SLOTS

_GGUF_MAGIC = b"GGUF"


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
    mmap: bool | None = None  # True: map the file (llama.cpp's way); False: read it in; None: memory.py decides
    fast_path: str | None = None  # llama.cpp's extra CPU buffer types: "all", "repack", "none"; None: fastpath.py
    # tests which survive on this machine (--repack = "all", --no-repack = "none")
    mtp: bool = False  # load the GGUF's MTP (nextn) heads, where it has them: a drafter inside the model (mtp.py)

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


def check_not_truncated(p: Path) -> None:
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


def new_context(model: _internals.LlamaModel, p: Path, options: LoadOptions, *,
                recurrent: bool = False) -> _internals.LlamaContext:
    """A llama context for one sequence. Threads: all cores until the thread controller (threads.py) sets them
    per round; flash attention: as calibrated (None = llama.cpp's auto). A model with a recurrent state gets
    llama.cpp's per-token snapshots where its architecture has them, else spare sequences for its checkpoints
    with one KV cache they share (rollback.py): each multiplies the recurrent state's memory, so never both."""
    if recurrent:
        ctx = _context(model, p, options, rs_depth=RS_DEPTH)  # llama.cpp clamps it to 0 where it cannot
        if llama_cpp.llama_n_rs_seq(ctx.ctx) > 0:
            return ctx
        ctx.close()
        return _context(model, p, options, spare_seqs=SLOTS)
    return _context(model, p, options)


def _context(model: _internals.LlamaModel, p: Path, options: LoadOptions, *, rs_depth: int = 0,
             spare_seqs: int = 0) -> _internals.LlamaContext:
    threads = options.n_threads or cpu_count()
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = options.n_ctx
    cparams.n_batch = options.n_batch
    cparams.n_ubatch = options.n_batch
    cparams.n_seq_max = 1 + spare_seqs
    cparams.kv_unified = spare_seqs > 0  # else each sequence would get n_ctx / n_seq_max positions
    cparams.n_rs_seq = rs_depth
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


def place_weights(mparams: llama_cpp.llama_model_params, p: Path, options: LoadOptions) -> tuple[str, Any]:
    """("read", the load-progress callback that marks the buffers, to keep alive; None off Linux) where memory.py
    says reading into huge pages pays, else ("mmap", None) with llama.cpp's mmap as asked."""
    # Only a CPU-only build: a GPU build's load maps the driver's own anonymous regions (pinned host buffers,
    # reserved address ranges) among those the advisor marks, and on CUDA that load died by SIGSEGV (an H100,
    # docs/bench/gpu.md); there the weights are mapped, as llama.cpp does by default.
    on_cpu = not supports_gpu_offload()
    if not read_into_huge_pages(p.stat().st_size, on_cpu, options.mmap):
        if options.mmap:
            mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
        return "mmap", None
    mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    if not on_cpu:  # --no-mmap on a GPU build: read, without marking the driver's regions
        return "read", None
    advisor = huge_page_advisor()
    if advisor is not None:
        mparams.progress_callback = advisor
    return "read", advisor


def load_weights(p: Path, mparams: llama_cpp.llama_model_params, options: LoadOptions) -> _internals.LlamaModel:
    try:
        return _internals.LlamaModel(path_model=str(p), params=mparams, verbose=options.verbose)
    except ValueError:
        check_not_truncated(p)  # a precise reason when the header or data is damaged
        raise ModelLoadError(f"llama.cpp could not load {p}: unsupported architecture or damaged file "
                             "(rerun with --verbose to see llama.cpp's log)") from None
