"""A tiny random-weight RWKV-6 GGUF whose `time_mix_w2` is a 3-D F16 tensor: the shape llama.cpp's AMX kernels
take and get wrong (the AMX buffer type's `supports_op` accepts F16 weights and has no 2-D check), so on a CPU
with AMX its default placement gives other logits than plain llama.cpp, or crashes (docs/bench/fastpath.md).
Elsewhere it is an ordinary recurrent model.

Layout (n_embd 32, as the other tiny models of tiny_gguf.py, whose tensor drawing it shares): 2 layers, WKV heads
of 8, time-mix low-rank 32 (the AMX F16 kernels want it a multiple of 16), decay low-rank 32, FFN 64. Every
tensor is F32 except the token embeddings (F16, only read by row) and `time_mix_w2` (F16, 3-D); the output
layer is its own F32 matrix, so no other weight goes to AMX.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_gguf import N_EMBD, N_FF, Random, embeddings, read_tokenizer, write_gguf

VERSION = 1  # part of the file name: bump it when what the file holds changes
N_LAYER = 2
HEAD_SIZE = 8
MIX_DIM = 32  # time_mix_extra_dim
DECAY_DIM = 32  # time_decay_extra_dim
F16 = ("token_embd.weight", "time_mix_w2.weight")


def file_name() -> str:
    return f"tiny-rwkv6-v{VERSION}.gguf"


def _norm(r: Random, name: str) -> None:
    r.ones(name + ".weight", N_EMBD)
    r.zeros(name + ".bias", N_EMBD)


def _lerp(r: Random, name: str, *lead: int) -> None:
    """A token-shift mix in [0, 1], as trained RWKV models have."""
    r.put(name, r.rng.uniform(0.0, 1.0, (*lead, 1, 1, N_EMBD)))


def _layer(r: Random, b: str) -> None:
    _norm(r, b + "attn_norm")
    _norm(r, b + "attn_norm_2")
    r.matrix(b + "time_mix_w1.weight", MIX_DIM * 5, N_EMBD)
    r.put(b + "time_mix_w2.weight", r.rng.normal(0.0, 1.0 / np.sqrt(MIX_DIM), (5, N_EMBD, MIX_DIM)))  # 3-D
    _lerp(r, b + "time_mix_lerp_x.weight")
    _lerp(r, b + "time_mix_lerp_fused.weight", 5)
    r.put(b + "time_mix_first.weight", r.rng.normal(0.0, 0.5, (N_EMBD // HEAD_SIZE, HEAD_SIZE)))
    r.put(b + "time_mix_decay.weight", r.rng.uniform(-3.0, 0.0, N_EMBD))  # w = exp(-exp(d)): keeps 0.95-0.37
    r.matrix(b + "time_mix_decay_w1.weight", DECAY_DIM, N_EMBD)
    r.matrix(b + "time_mix_decay_w2.weight", N_EMBD, DECAY_DIM, gain=0.1)
    for part in ("key", "value", "receptance", "gate", "output"):
        r.matrix(b + f"time_mix_{part}.weight", N_EMBD, N_EMBD)
    _norm(r, b + "time_mix_ln")
    _lerp(r, b + "channel_mix_lerp_k.weight")
    _lerp(r, b + "channel_mix_lerp_r.weight")
    r.matrix(b + "channel_mix_key.weight", N_FF, N_EMBD)
    r.matrix(b + "channel_mix_value.weight", N_EMBD, N_FF)
    r.matrix(b + "channel_mix_receptance.weight", N_EMBD, N_EMBD)


def write_rwkv6(tokenizer_from: Path, out: Path, *, seed: int = 0) -> Path:
    """Write the tiny RWKV-6 with the tokenizer of the GGUF `tokenizer_from` to `out` (under a temporary name,
    then renamed, so a run cut short never leaves a half file under the real name)."""

    fields, n_vocab = read_tokenizer(tokenizer_from)
    r = Random(seed)
    embeddings(r, n_vocab)
    _norm(r, "token_embd_norm")
    for i in range(N_LAYER):
        _layer(r, f"blk.{i}.")
    _norm(r, "output_norm")
    r.matrix("output.weight", n_vocab, N_EMBD)
    hparams = {"block_count": N_LAYER, "feed_forward_length": N_FF, "wkv.head_size": HEAD_SIZE,
               "time_mix_extra_dim": MIX_DIM, "time_decay_extra_dim": DECAY_DIM, "rescale_every_n_layers": 0,
               "token_shift_count": 2, "attention.layer_norm_epsilon": 1e-5}

    return write_gguf(out, "rwkv6", f"localspec tiny rwkv6 v{VERSION} seed {seed}", hparams, n_vocab, fields,
                      r.tensors, lambda name: name.endswith(F16))
