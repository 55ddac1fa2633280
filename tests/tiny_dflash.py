"""Tiny DFlash drafter GGUFs for the tiny qwen35 target of tiny_gguf.py: a separate file that llama.cpp loads as its
own model (arch `dflash`) and runs beside the target, its KV cache fed with the target's layer inputs.

llama.cpp's dflash model (src/models/dflash.cpp) has one decoder with two modes. An embeddings batch (the inputs of
the target layers `dflash.target_layers`, side by side) goes through `fc` and `enc.output_norm` and is written as
K/V into every layer's cache at the target's positions. A token batch, the block [last token, mask × n], runs the
decoder layers (q/k norms, SwiGLU) with non-causal attention over the cache and the block; rows 1..n are the
drafts. The token embeddings and the lm head are the target's (ctx_other). The mask token is the vocabulary's
`tokenizer.ggml.mask_token_id`, which the copied tokenizer lacks, so the file names one.

Sizes are tiny_gguf's (n_embd 32 = the target's: the injected rows are target_layers × the drafter's n_embd; SwiGLU
64, 4 heads of 8 with 2 KV heads), two layers, block size 8. Random weights: drafts that are noise, nearly all
rejected, but deterministic, which is what the round-by-round comparison with llama.cpp needs.
"""

from __future__ import annotations

from pathlib import Path

import gguf
from tiny_gguf import HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, ROPE_BASE, Random, read_tokenizer, write_gguf

VERSION = 1  # part of the file name: bump it when what a file holds changes
LAYERS = [1, 2, 3]  # the tiny qwen35's trunk layers whose inputs the drafter reads (it has 4)
N_LAYER = 2
BLOCK_SIZE = 8  # drafts of up to 7 tokens
MASK_TOKEN = 1


def file_name() -> str:
    return f"tiny-dflash-v{VERSION}.gguf"


def _draw(seed: int) -> Random:
    r = Random(seed)
    r.matrix("fc.weight", N_EMBD, len(LAYERS) * N_EMBD)
    r.ones("enc.output_norm.weight", N_EMBD)
    r.ones("output_norm.weight", N_EMBD)
    for i in range(N_LAYER):
        b = f"blk.{i}."
        r.ones(b + "attn_norm.weight", N_EMBD)
        r.matrix(b + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
        r.matrix(b + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        r.matrix(b + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        r.matrix(b + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        r.ones(b + "attn_q_norm.weight", HEAD_DIM)
        r.ones(b + "attn_k_norm.weight", HEAD_DIM)
        r.ones(b + "ffn_norm.weight", N_EMBD)
        r.matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
        r.matrix(b + "ffn_up.weight", N_FF, N_EMBD)
        r.matrix(b + "ffn_down.weight", N_EMBD, N_FF)
    return r


def write_dflash(tokenizer_from: Path, out: Path, *, seed: int = 0) -> Path:
    """A random dflash drafter for a target of n_embd 32 with 4+ layers, using the target's embeddings and head."""
    fields, n_vocab = read_tokenizer(tokenizer_from)
    mask = ("tokenizer.ggml.mask_token_id", MASK_TOKEN, gguf.GGUFValueType.UINT32, None)
    hparams = {"block_count": N_LAYER, "feed_forward_length": N_FF, "attention.head_count": N_HEAD,
               "attention.head_count_kv": N_HEAD_KV, "rope.freq_base": ROPE_BASE, "target_layers": LAYERS,
               "block_size": BLOCK_SIZE}
    return write_gguf(out, "dflash", f"localspec tiny dflash v{VERSION} seed {seed}", hparams, n_vocab,
                      [*fields, mask], _draw(seed).tensors, lambda name: False)
