"""A tiny step35 GGUF with three chained MTP ("nextn") heads: the other MTP shape llama.cpp drives, where head i
drafts position i from head i-1's hidden state (llama.cpp picks the head with `llama_set_nextn_layer_offset`).

Step-3.5's layout scaled down (n_embd 32, as tiny_gguf.py's models, whose tensor drawing it shares): 2 trunk
layers of attention (4 heads of 8, 2 KV heads, per-head q/k norms and step35's head-wise sigmoid gate) with a dense
SwiGLU FFN, then 3 MTP blocks, each a full decoder layer of the same kind fed through eh_proj with the token's
embedding and a hidden state. Layer 0 is a sliding-window layer, the rest full attention (step35's KV cache is
llama.cpp's iSWA one); the window (4096) is wider than any context the tests use, so it never drops a position.
The lm head is its own matrix (step35's loader requires `output.weight`); both it and the embeddings are F16.

`write_step35(..., echo=None)` draws random weights: the heads' drafts are noise and (nearly) all rejected.
`echo=noise` zeroes every attention and FFN output, so the trunk is a bigram (the residual stream is the token's
embedding) and each head's eh_proj passes the token's normed embedding on (identity on that half, plus `noise` ·
N(0, 1/√(2·n_embd))): at noise 0 every head predicts what the trunk will, at some noise drafts part from it where
the trunk's top choices are close (acceptance neither 0 nor all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tiny_gguf import (
    HEAD_DIM,
    N_EMBD,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    ROPE_BASE,
    Random,
    embeddings,
    read_tokenizer,
    write_gguf,
)

VERSION = 1  # part of the file name: bump it when what the file holds changes
TRUNK = 2
HEADS = 3  # nextn_predict_layers: three, so a draft step also reads a head's state from a batch of several rows
SWA = [1, 0, 0, 0, 0]  # per layer, trunk then heads: 1 = sliding window
WINDOW = 4096
F16 = ("token_embd.weight", "output.weight")
SILENT = ("attn_output.weight", "ffn_down.weight")  # zeroed in the echo: the blocks add nothing to the residual


def file_name(echo: float | None = None) -> str:
    return f"tiny-step35-v{VERSION}.gguf" if echo is None else f"tiny-step35-echo-v{VERSION}-{echo}.gguf"


def _block(r: Random, b: str) -> None:
    """One step35 decoder layer, dense: attention with q/k norms and a sigmoid gate per head, then SwiGLU."""
    r.ones(b + "attn_norm.weight", N_EMBD)
    r.matrix(b + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
    r.ones(b + "attn_q_norm.weight", HEAD_DIM)
    r.ones(b + "attn_k_norm.weight", HEAD_DIM)
    r.matrix(b + "attn_gate.weight", N_HEAD, N_EMBD)
    r.ones(b + "ffn_norm.weight", N_EMBD)
    r.matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_up.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_down.weight", N_EMBD, N_FF)


def _step35(r: Random, n_vocab: int) -> dict[str, Any]:
    embeddings(r, n_vocab)
    r.ones("output_norm.weight", N_EMBD)
    r.matrix("output.weight", n_vocab, N_EMBD)
    for i in range(TRUNK + HEADS):
        _block(r, f"blk.{i}.")
        if i >= TRUNK:
            b = f"blk.{i}.nextn."
            r.matrix(b + "eh_proj.weight", N_EMBD, 2 * N_EMBD)
            r.ones(b + "enorm.weight", N_EMBD)
            r.ones(b + "hnorm.weight", N_EMBD)
            r.ones(b + "shared_head_norm.weight", N_EMBD)
    return {"block_count": TRUNK + HEADS, "nextn_predict_layers": HEADS, "feed_forward_length": N_FF,
            "expert_feed_forward_length": N_FF, "attention.head_count": N_HEAD,
            "attention.head_count_kv": N_HEAD_KV, "attention.key_length": HEAD_DIM,
            "attention.value_length": HEAD_DIM, "rope.dimension_count": HEAD_DIM, "rope.freq_base": ROPE_BASE,
            "attention.sliding_window": WINDOW, "attention.sliding_window_pattern": SWA}


def write_step35(tokenizer_from: Path, out: Path, *, seed: int = 0, echo: float | None = None) -> Path:
    """Write the tiny step35 (random, or the echo at that noise; see the module docstring) to `out`."""
    fields, n_vocab = read_tokenizer(tokenizer_from)
    r = Random(seed)
    hparams = _step35(r, n_vocab)
    tensors = r.tensors
    if echo is not None:
        eh = np.concatenate([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))], axis=1)

        def echoed(name: str, v: np.ndarray) -> np.ndarray:
            if name.endswith(SILENT):
                return np.zeros_like(v)
            if name.endswith("nextn.eh_proj.weight"):
                return (eh + echo * r.rng.normal(0.0, 1.0 / np.sqrt(2 * N_EMBD), eh.shape)).astype(np.float32)
            return v

        tensors = [(name, echoed(name, v)) for name, v in tensors]
        # the lm head: the embeddings in a shuffled order, so the bigram walks a long cycle of tokens instead of
        # settling on the one whose embedding is most like itself
        embd = dict(tensors)["token_embd.weight"]
        tensors = [(n, embd[r.rng.permutation(n_vocab)] if n == "output.weight" else v) for n, v in tensors]
    title = f"localspec tiny step35 v{VERSION} seed {seed}" + ("" if echo is None else f" echo {echo}")
    return write_gguf(out, "step35", title, hparams, n_vocab, fields, tensors, lambda name: name in F16)
