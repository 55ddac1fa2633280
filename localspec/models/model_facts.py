"""What a GGUF says about its model, read from the header only: `models show`/`models list` facts, the trained
context and the KV-cache memory a context length takes (the loader refuses --ctx above the trained context)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .gguf_header import GGUFHeader, read_header

_SPECIAL = ("bos", "eos", "eot", "eom", "unknown", "padding", "sep", "mask",
            "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")


def _file_type_name(v: int | None) -> str | None:
    import gguf

    try:
        return gguf.LlamaFileType(v).name.removeprefix("MOSTLY_") if v is not None else None
    except ValueError:
        return str(v)


def _params_by_type(h: GGUFHeader, min_dims: int = 1) -> dict[str, int]:
    """{ggml type name: parameters} over the tensors of at least `min_dims` dimensions (2: the matrices)."""
    import gguf

    counts: dict[str, int] = {}
    for _, dims, t in h.tensors:
        if len(dims) >= min_dims:
            try:
                name = gguf.GGMLQuantizationType(t).name
            except ValueError:
                name = str(t)
            counts[name] = counts.get(name, 0) + math.prod(dims)
    return counts


def _dominant_tensor_type(h: GGUFHeader) -> str | None:
    counts = _params_by_type(h)
    return max(counts, key=counts.__getitem__) if counts else None


def _quant(h: GGUFHeader) -> str | None:
    return _file_type_name(h.kv.get("general.file_type")) or _dominant_tensor_type(h)


# Weight types that llama.cpp's CPU backend multiplies one batch row at a time: neither a repacked GEMM
# (ggml-cpu/repack.cpp: Q4_0, Q4_K, IQ4_NL, Q8_0, ...) nor llamafile's tiled sgemm (F32, F16, BF16, Q8_0, Q4_0,
# Q5_0, IQ4_NL) takes them, in the llama.cpp that llama-cpp-python 0.3.36 vendors; only an Intel AMX build
# (ggml-cpu/amx) and SpacemiT's RISC-V kernels have a batched one, so on x86 desktops and ARM none. A verify round of
# n rows then costs about n times a row's compute, where a batched kernel shares the work of loading and unpacking
# each block of weights (timed: docs/bench/lookup.md#verify-row-cost).
ROW_BY_ROW = ("Q4_1", "Q5_1")


def row_by_row(h: GGUFHeader) -> dict[str, float]:
    """{type: share of the matrix weights} for the `ROW_BY_ROW` types this file's 2-D tensors use."""
    sizes = _params_by_type(h, min_dims=2)
    total = sum(sizes.values())
    return {t: n / total for t, n in sizes.items() if t in ROW_BY_ROW} if total else {}


def verify_hint(path: str | Path) -> str | None:
    """One line for a user deciding whether speculation can pay on a CPU, when most of this model's weights are
    of a `ROW_BY_ROW` type; None otherwise (and for a file it cannot read: loading it says what is wrong)."""
    try:
        slow = row_by_row(read_header(path, tokens=False))
    except ModelLoadError:
        return None
    share = sum(slow.values())
    if share < 0.5:
        return None
    return (f"{100 * share:.0f} % of its weights are {'/'.join(slow)}, which llama.cpp multiplies a row at a time "
            f"on most CPUs: each token a verify round checks costs 1.3-1.8x what it does with a Q4_K_M or Q4_0 file of "
            f"the same model, so drafts pay less (docs/bench/lookup.md#verify-row-cost)")


def describe(path: str | Path) -> dict[str, Any]:
    """What `localspec models show` prints: facts from the header, as plain data (JSON-ready)."""
    h = read_header(path)
    kv = h.kv
    arch = kv.get("general.architecture", "?")
    tokens = kv.get("tokenizer.ggml.tokens", ())
    special = {}
    for s in _SPECIAL:
        tid = kv.get(f"tokenizer.ggml.{s}_token_id")
        if tid is not None:
            text = tokens[tid].decode("utf-8", "replace") if 0 <= tid < len(tokens) else "?"
            special[s] = {"id": tid, "text": text}
    return {
        "path": str(h.path), "size_bytes": h.path.stat().st_size, "gguf_version": h.version,
        "name": kv.get("general.name"), "arch": arch, "size_label": kv.get("general.size_label"),
        "params": sum(math.prod(dims) for _, dims, _t in h.tensors), "n_tensors": len(h.tensors),
        "n_layers": kv.get(f"{arch}.block_count"), "quant": _quant(h),
        "context_length": kv.get(f"{arch}.context_length"), "embedding_length": kv.get(f"{arch}.embedding_length"),
        "vocab_type": kv.get("tokenizer.ggml.model"), "vocab_pre": kv.get("tokenizer.ggml.pre"),
        "n_vocab": h.array_lengths.get("tokenizer.ggml.tokens", 0),
        "add_bos": kv.get("tokenizer.ggml.add_bos_token"), "add_eos": kv.get("tokenizer.ggml.add_eos_token"),
        "special_tokens": special, "fim": all(f"fim_{x}" in special for x in ("pre", "suf", "mid")),
        "chat_template": "tokenizer.chat_template" in kv,
        "row_by_row": row_by_row(h),
    }


def quick_facts(path: str | Path) -> dict[str, Any]:
    """Arch, quant and size for `models list` (skips the vocabulary)."""
    h = read_header(path, tokens=False)
    return {"arch": h.kv.get("general.architecture", "?"), "size_bytes": h.path.stat().st_size, "quant": _quant(h)}


# -- context length and KV memory -------------------------------------------------------------------------------

def trained_context(path: str | Path) -> int | None:
    """`<arch>.context_length`: the context the model was trained for (None when the GGUF does not say)."""
    kv = read_header(path, tokens=False).kv
    n = kv.get(f"{kv.get('general.architecture', '?')}.context_length")
    return int(n) if isinstance(n, int) and n > 0 else None
