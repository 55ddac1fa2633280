"""Rewrite a GGUF with the `gguf` package: dequantized copies and extra metadata.

Used for test fixtures and CPU benchmarks, not for models to recommend:
- `write_dequantized`: the same weights in F16 — a same-tokenizer target with a real cost gap over its Q4 original
  (which then serves as the drafter).
- `write_with_metadata`: the same file with metadata keys added or replaced (e.g. FIM token ids).
- `write_requantized`: the matrix weights in another type the `gguf` package can quantize (Q4_0, Q8_0, ...):
  the same model in a weight type whose kernels differ (scripts/bench_fastpath.py, CPU_REPACK's Q4_0 layout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
