#!/usr/bin/env python3
"""Write a llama-architecture GGUF of a real model's shape with random weights, for timing (scripts/gpu_check.sh).

Random weights decode exactly as fast as trained ones of the same shape and quant type (every kernel does the
same work), so a 1-8 B target can be made on the GPU machine in seconds instead of carried there (no network,
64 MiB per call). Its text is noise; only its timings, placement and memory are real.

The tokenizer (every `tokenizer.*` key) is copied from a real GGUF, by default the shipped SmolLM2-135M (or the
small tokenizer-only file `tokenizer` writes from it), so SmolLM2 passes `localspec models check` as its drafter
and prompt lookup sees real tokens. The quantized blocks are random bytes with their f16 scale fields set to
small values (no NaN/inf), e.g. Q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles per 256.

usage: gpu_model.py tokenizer SRC.gguf OUT.gguf            (tokenizer keys only, no tensors: ~2 MB)
       gpu_model.py make --shape 8b [--type q4_k] --tokenizer T.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
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
    hd = shape.n_embd // shape.n_head
    per_layer = (2 * shape.n_embd * shape.n_head * hd + 2 * shape.n_embd * shape.n_head_kv * hd
                 + 3 * shape.n_embd * shape.n_ff + 2 * shape.n_embd)
    return n_vocab * shape.n_embd + shape.n_layer * per_layer + shape.n_embd


def tokenizer_fields(src: str | Path) -> list[tuple[str, object, object, object]]:
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
        raise SystemExit(f"{src} has no tokenizer.ggml.tokens")
    return out


def write_tokenizer(src: str | Path, dst: str | Path) -> Path:
    """A GGUF with only src's tokenizer keys (no tensors): what `make` needs, carried instead of the model."""
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


def make_model(out: str | Path, shape_name: str, qtype_name: str, tokenizer: str | Path, seed: int = 0,
               log=print) -> Path:
    import gguf

    shape = SHAPES[shape_name]
    qtype = gguf.GGMLQuantizationType[TYPES[qtype_name]]
    fields = tokenizer_fields(tokenizer)
    n_vocab = len(next(v for name, v, *_ in fields if name == "tokenizer.ggml.tokens"))
    out = Path(out)
    part = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    w = gguf.GGUFWriter(str(part), arch="llama")
    w.add_name(f"localspec random llama {shape_name} {qtype.name}")
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
    w.add_file_type(FILE_TYPE[qtype.name])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, value, vtype, sub in fields:
        w.add_key_value(name, value, vtype, sub_type=sub)
    plan = tensor_plan(shape, n_vocab)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    for name, rows, cols, quant in plan:
        if quant:
            nbytes = rows * cols // block * size
            w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        else:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="write SRC's tokenizer keys alone to OUT")
    t.add_argument("src")
    t.add_argument("out")
    m = sub.add_parser("make", help="write a random-weight llama GGUF")
    m.add_argument("out")
    m.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    m.add_argument("--type", choices=sorted(TYPES), default="q4_k")
    m.add_argument("--tokenizer", required=True, help="a GGUF to copy tokenizer.* from")
    m.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "tokenizer":
        p = write_tokenizer(a.src, a.out)
        print(f"wrote {p} ({p.stat().st_size / 2**20:.1f} MiB)")
    else:
        make_model(a.out, a.shape, a.type, a.tokenizer, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
