"""Write GGUFs with the `gguf` package: rewritten copies, and random-weight models of a real model's shape.

Used for test fixtures, benchmarks and the GPU check, not for models to recommend:
- `write_dequantized`: the same weights in F16 — a same-tokenizer target with a real cost gap over its Q4 original
  (which then serves as the drafter).
- `write_with_metadata`: the same file with metadata keys added or replaced (e.g. FIM token ids).
- `write_requantized`: the matrix weights in another type the `gguf` package can quantize (Q4_0, Q8_0, ...):
  the same model in a weight type whose kernels differ (CPU_REPACK's Q4_0 layout).
- `write_random_model`: a llama model of a real shape (SHAPES) with random weights and a real tokenizer, and
  `write_tokenizer`, that tokenizer alone. Random weights decode exactly as fast as trained ones of the same shape
  and quant type (every kernel does the same work), so a 1-8 B target is made where it is timed (the GPU check's
  machine has no network) instead of carried there; its text is noise, its timings, placement and memory are
  real. The tokenizer keys come from a real GGUF (SmolLM2), so that model passes the pairing check as its drafter
  and prompt lookup sees real tokens. Quantized blocks are random bytes with their f16 scale fields set small
  (no NaN/inf), e.g. Q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles per 256 weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

_FILE_TYPE = {"F32": 0, "F16": 1}


def _value_type(v: Any):
    from gguf import GGUFValueType

    if isinstance(v, bool):
        return GGUFValueType.BOOL
    if isinstance(v, int):
        return GGUFValueType.UINT32 if v >= 0 else GGUFValueType.INT32
    if isinstance(v, float):
        return GGUFValueType.FLOAT32
    if isinstance(v, str):
        return GGUFValueType.STRING
    raise TypeError(f"unsupported metadata value {v!r}")


def copy_gguf(src: str | Path, dst: str | Path, *, extra: dict[str, Any] | None = None,
              dequantize: str | None = None, requantize: str | None = None) -> Path:
    """Copy src to dst, replacing/adding `extra` metadata and optionally dequantizing weights to F16/F32.

    Written to dst + '.part' and renamed, so a crash never leaves a half file under the real name.
    """
    import gguf

    src, dst = Path(src), Path(dst)
    extra = dict(extra or {})
    if dequantize:
        extra["general.file_type"] = _FILE_TYPE[dequantize]
    reader = gguf.GGUFReader(str(src))
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise ValueError(f"{src}: no {gguf.Keys.General.ARCHITECTURE} in its header")
    arch = arch_field.contents()
    part = dst.with_name(dst.name + ".part")
    dst.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(part), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or field.name in extra:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for key, value in extra.items():
        writer.add_key_value(key, value, _value_type(value))
    tensors = [(t.name, _requantized(t, requantize) if requantize else _converted(t, dequantize))
               for t in reader.tensors]
    for (name, (data, raw)), t in zip(tensors, reader.tensors):
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, (data, _) in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()
    part.replace(dst)
    return dst


def _converted(t, dequantize: str | None):
    """(array, raw_dtype) to write for one tensor."""
    import gguf

    T = gguf.GGMLQuantizationType
    if not dequantize or t.tensor_type == T.F32 or (t.tensor_type == T.F16 and dequantize == "F16"):
        return t.data, t.tensor_type
    values = gguf.quants.dequantize(t.data, t.tensor_type)
    if dequantize == "F16":
        return values.astype(np.float16), T.F16
    return values.astype(np.float32), T.F32


def _requantized(t, to: str):
    """(array, raw_dtype): a 2-D weight (not the embeddings, read by row) quantized to `to`; others as they are."""
    import gguf

    T = gguf.GGMLQuantizationType
    block = gguf.GGML_QUANT_SIZES[T[to]][0]
    if len(t.shape) != 2 or "token_embd" in t.name or int(t.shape[0]) % block:
        return t.data, t.tensor_type
    values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    return gguf.quants.quantize(values, T[to]), T[to]


def write_requantized(src: str | Path, dst: str | Path, to: str = "Q4_0") -> Path:
    """The same model with its matrix weights (embeddings excepted) quantized to `to`."""
    return copy_gguf(src, dst, requantize=to)


def write_dequantized(src: str | Path, dst: str | Path, to: str = "F16") -> Path:
    """The same model with every quantized tensor expanded to `to` (F16 or F32)."""
    return copy_gguf(src, dst, dequantize=to)


def write_with_metadata(src: str | Path, dst: str | Path, extra: dict[str, Any]) -> Path:
    """The same model with metadata keys added or replaced."""
    return copy_gguf(src, dst, extra=extra)


# -- random-weight models ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """A llama model's dimensions (what a random-weight copy needs to cost what the real one costs)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    rope_base: float = 500000.0
    n_ctx: int = 8192


SHAPES = {
    "tiny": Shape(256, 2, 4, 2, 512),  # tests: loads in milliseconds
    "cpu": Shape(768, 12, 12, 4, 2048),  # ~110 M: the CPU rehearsal of the check
    "1b": Shape(2048, 16, 32, 8, 8192),  # Llama-3.2-1B
    "3b": Shape(3072, 28, 24, 8, 8192),  # Llama-3.2-3B
    "8b": Shape(4096, 32, 32, 8, 14336),  # Llama-3.1-8B
}
# weight ~ std 0.02 for each type's random codes (see _blocks)
TYPES = {"q4_0": "Q4_0", "q8_0": "Q8_0", "q4_k": "Q4_K"}
FILE_TYPE = {"Q4_0": 2, "Q8_0": 7, "Q4_K": 15}  # llama_ftype: MOSTLY_Q4_0, MOSTLY_Q8_0, MOSTLY_Q4_K_M


def n_params(shape: Shape, n_vocab: int) -> int:
    """Parameters of a llama model of this shape with tied embeddings."""
    hd = shape.n_embd // shape.n_head
    per_layer = (2 * shape.n_embd * shape.n_head * hd + 2 * shape.n_embd * shape.n_head_kv * hd
                 + 3 * shape.n_embd * shape.n_ff + 2 * shape.n_embd)
    return n_vocab * shape.n_embd + shape.n_layer * per_layer + shape.n_embd


def tokenizer_fields(src: str | Path) -> list[tuple[str, Any, Any, Any]]:
    """(name, value, type, sub_type) of every tokenizer.* key of a GGUF."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    out = []
    for f in reader.fields.values():
        if f.name.startswith("tokenizer."):
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            out.append((f.name, f.contents(), vtype, sub))
    if not any(name == "tokenizer.ggml.tokens" for name, *_ in out):
        raise ValueError(f"{src} has no tokenizer.ggml.tokens")
    return out


def write_tokenizer(src: str | Path, dst: str | Path) -> Path:
    """A GGUF with only src's tokenizer keys (no tensors): what write_random_model needs, carried instead of the
    model."""
    import gguf

    w = gguf.GGUFWriter(str(dst), arch="llama")
    for name, value, vtype, sub in tokenizer_fields(src):
        w.add_key_value(name, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return Path(dst)


def _blocks(qtype, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """rows x cols weights of `qtype` as random blocks (uint8, shape (rows, bytes per row)), scales set."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block} values, got {cols}")
    n_blocks = rows * cols // block
    data = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    T = gguf.GGMLQuantizationType
    # d (f16) first in every block; Q4_K also dmin: w = d·sc·q − dmin·m (sc, m 6-bit; q 4-bit)
    d = {T.Q4_0: 0.02 / 4.6, T.Q8_0: 0.02 / 74, T.Q4_K: 0.02 / 300}[qtype]
    data[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    if qtype == T.Q4_K:
        data[:, 2:4] = np.frombuffer(np.float16(d * 7.5).tobytes(), dtype=np.uint8)
    return data.reshape(rows, cols // block * size)


def tensor_plan(shape: Shape, n_vocab: int) -> list[tuple[str, int, int, bool]]:
    """(name, rows, cols, quantized) in llama.cpp's llama layout (numpy order: rows = output features)."""
    hd = shape.n_embd // shape.n_head
    e, q, kv = shape.n_embd, shape.n_head * hd, shape.n_head_kv * hd
    plan = [("token_embd.weight", n_vocab, e, True), ("output_norm.weight", 1, e, False)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", 1, e, False), (b + "attn_q.weight", q, e, True),
                 (b + "attn_k.weight", kv, e, True), (b + "attn_v.weight", kv, e, True),
                 (b + "attn_output.weight", e, q, True), (b + "ffn_norm.weight", 1, e, False),
                 (b + "ffn_gate.weight", shape.n_ff, e, True), (b + "ffn_up.weight", shape.n_ff, e, True),
                 (b + "ffn_down.weight", e, shape.n_ff, True)]
    return plan  # no output.weight: tied to token_embd, as in SmolLM2 and Llama-3.2


def write_random_model(out: str | Path, shape_name: str, qtype_name: str, tokenizer: str | Path, seed: int = 0,
                       log: Callable[[str], object] = print) -> Path:
    """A llama GGUF of SHAPES[shape_name] with random `qtype_name` weights and the tokenizer keys of `tokenizer`."""
    import gguf

    shape = SHAPES[shape_name]
    qtype = gguf.GGMLQuantizationType[TYPES[qtype_name]]
    fields = tokenizer_fields(tokenizer)
    n_vocab = len(next(v for name, v, *_ in fields if name == "tokenizer.ggml.tokens"))
    out = Path(out)
    part = out.with_name(out.name + ".part")  # a run cut short never leaves a file that looks finished
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    w = gguf.GGUFWriter(str(part), arch="llama")
    w.add_name(f"localspec random llama {shape_name} {qtype.name}")
    _add_llama_keys(w, shape, n_vocab, FILE_TYPE[qtype.name])
    for name, value, vtype, sub in fields:
        w.add_key_value(name, value, vtype, sub_type=sub)
    plan = tensor_plan(shape, n_vocab)
    _add_tensor_infos(w, plan, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, rows, cols, quant in plan:
        data = _blocks(qtype, rows, cols, rng) if quant else np.ones(cols, dtype=np.float32)
        w.write_tensor_data(data)
    w.close()
    part.replace(out)
    log(f"wrote {out}: {shape_name} {qtype.name}, {n_params(shape, n_vocab) / 1e9:.2f} B params, "
        f"{out.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s")
    return out


def _add_llama_keys(w, shape: Shape, n_vocab: int, file_type: int) -> None:
    """The hyperparameters llama.cpp's llama architecture reads."""
    import gguf

    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_tensor_infos(w, plan: list[tuple[str, int, int, bool]], qtype) -> None:
    """Declare each tensor before any data is written: quantized matrices as their raw block bytes (the writer
    takes a byte shape with raw_dtype), norms as F32 vectors."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    for name, rows, cols, quant in plan:
        if quant:
            nbytes = rows * cols // block * size
            w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        else:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
