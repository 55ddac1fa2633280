"""Tiny EAGLE-3 drafter GGUFs for the tiny qwen35 targets of tiny_gguf.py: a separate file that llama.cpp loads as
its own model (arch `eagle3`) and runs beside the target, fed with the target's hidden states.

llama.cpp's eagle3 model (src/models/eagle3.cpp) has two graphs. The encoder projects the inputs of three target
layers (`eagle3.target_layers`, concatenated: 3 × the target's n_embd, `eagle3.target_hidden_size` each) through
`fc` to the drafter's width: g. The decoder is one decoder layer whose attention reads the token's embedding and g
side by side (attn_norm on the one, attn_norm_2 on the other, q/k/v over both); its pre-norm output stands in for g
at the next draft step. The token embeddings and the lm head are the target's unless the file has its own; with
`d2t` the lm head covers a smaller draft vocabulary and d2t[i] is the target id of draft row i.

Sizes are tiny_gguf's (n_embd 32 = the target's, SwiGLU 64, 4 heads of 8 with 2 KV heads). The tokenizer keys are
copied from the target's source (llama.cpp loads a vocabulary with every model). Two kinds:

- `write_eagle3(target, tokenizer_from, out)`: random weights, the target's embeddings and lm head: drafts that are
  noise, (nearly) all rejected.
- `write_eagle3_echo(target, tokenizer_from, out, noise)`: for the echo qwen35 (a bigram trunk, so every layer's
  input is the token's embedding and its next token is q(t), q ≈ the inverse of the lm head's row shuffle). fc
  passes one layer's input on (plus `noise`), the layer's attention and FFN outputs are zero, the lm head is the
  target's and d2t = q: the drafter at position p, fed g_p = embedding of x_p, scores the target's next token
  x_{p+1} = q(x_p) highest and names q(x_{p+1}) = x_{p+2}, the token the target will choose after the one it is
  fed. Its later draft steps repeat that token, so first drafts are mostly accepted and later ones not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tiny_gguf import HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, ROPE_BASE, Random, read_tokenizer, write_gguf

VERSION = 1  # part of the file names: bump it when what a file holds changes
LAYERS = [1, 2, 3]  # the tiny qwen35's trunk layers whose inputs the drafter reads (it has 4)


def file_name(echo: float | None = None) -> str:
    return f"tiny-eagle3-v{VERSION}.gguf" if echo is None else f"tiny-eagle3-echo-v{VERSION}-{echo}.gguf"


def _layer(r: Random) -> None:
    """The one decoder layer: attention over [normed token embedding, normed g] (2 × n_embd in), SwiGLU FFN."""
    b = "blk.0."
    r.ones(b + "attn_norm.weight", N_EMBD)
    r.ones(b + "attn_norm_2.weight", N_EMBD)
    r.matrix(b + "attn_q.weight", N_HEAD * HEAD_DIM, 2 * N_EMBD)
    r.matrix(b + "attn_k.weight", N_HEAD_KV * HEAD_DIM, 2 * N_EMBD)
    r.matrix(b + "attn_v.weight", N_HEAD_KV * HEAD_DIM, 2 * N_EMBD)
    r.matrix(b + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
    r.ones(b + "ffn_norm.weight", N_EMBD)
    r.matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_up.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_down.weight", N_EMBD, N_FF)


def _hparams() -> dict[str, Any]:
    return {"block_count": 1, "feed_forward_length": N_FF, "attention.head_count": N_HEAD,
            "attention.head_count_kv": N_HEAD_KV, "rope.freq_base": ROPE_BASE, "target_layers": LAYERS,
            "target_hidden_size": N_EMBD}


def _draw(seed: int) -> Random:
    r = Random(seed)
    r.matrix("fc.weight", N_EMBD, len(LAYERS) * N_EMBD)
    r.ones("output_norm.weight", N_EMBD)
    _layer(r)
    return r


def write_eagle3(tokenizer_from: Path, out: Path, *, seed: int = 0) -> Path:
    """A random eagle3 drafter for a target of n_embd 32 with 4+ layers, using the target's embeddings and head."""
    fields, n_vocab = read_tokenizer(tokenizer_from)
    r = _draw(seed)
    return write_gguf(out, "eagle3", f"localspec tiny eagle3 v{VERSION} seed {seed}", _hparams(), n_vocab, fields,
                      r.tensors, lambda name: False)


def write_eagle3_echo(target: Path, tokenizer_from: Path, out: Path, *, seed: int = 0, noise: float = 0.0) -> Path:
    """The echo drafter for the echo qwen35 `target` (tiny_gguf.write_qwen35_echo; see the module docstring)."""
    import gguf

    fields, n_vocab = read_tokenizer(tokenizer_from)
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(target)).tensors
               if t.name in ("token_embd.weight", "output.weight")}
    embd, head = tensors["token_embd.weight"], tensors["output.weight"]
    # head row j is embedding row perm[j]: the trunk's next token after t is q(t) = perm⁻¹(t) (where t's own row
    # scores highest, as it mostly does)
    row_of = {row.tobytes(): i for i, row in enumerate(embd)}
    perm = np.array([row_of[row.tobytes()] for row in head], dtype=np.int64)
    q = np.argsort(perm).astype(np.int64)
    r = _draw(seed)
    silent = ("attn_output.weight", "ffn_down.weight")
    fc = np.concatenate([np.eye(N_EMBD), np.zeros((N_EMBD, (len(LAYERS) - 1) * N_EMBD))], axis=1)
    fc = fc + noise * r.rng.normal(0.0, 1.0 / np.sqrt(fc.shape[1]), fc.shape)
    drawn = [(name, np.zeros_like(v) if name.endswith(silent) else fc.astype(np.float32) if name == "fc.weight"
              else v) for name, v in r.tensors]
    drawn += [("output.weight", head.astype(np.float16)), ("d2t", q)]
    return write_gguf(out, "eagle3", f"localspec tiny eagle3 echo v{VERSION} seed {seed} noise {noise}", _hparams(),
                      n_vocab, fields, drawn, lambda name: name == "output.weight")
