"""Tiny random-weight GGUFs of recurrent and hybrid architectures, for tests that need such a model to load and run.

A real Mamba or LFM2 download is hundreds of MB; these files are about 5 MB and are written in a few seconds, so
the suite can check what localspec does with a memory that cannot always drop a suffix (recurrent state) next to
one that can (a KV cache). Their weights are random, so their text is noise, but it is varied noise: greedy
decoding walks through many tokens instead of repeating one.

The tokenizer keys are copied from a real GGUF (SmolLM2), so prompts tokenize as they do for the real model and
the SmolLM2 vocabulary (49152 tokens) is shared. That vocabulary is most of each file: the token embeddings are
the only large tensor, stored as F16 and tied to the output layer. Everything else is F32, which every kernel the
graphs use accepts (llama.cpp's CPU convolution and scan ops take F32 only).

Weights: matrices ~ N(0, gain / sqrt(fan_in)), so each layer's output has a magnitude near 1, and norms are 1.
The embeddings are small (std 0.02) beside that, so the residual stream is ruled by what the layers computed
from the context, not by the input token; with tied embeddings the model would otherwise predict the token it
was just given, forever. Same seed, same bytes.

Layouts (n_embd 32, SwiGLU FFN 64 wherever there is one, attention 4 heads of 8 with 2 KV heads):
- mamba: 2 Mamba-1 layers (d_inner 64, d_state 16, conv 4, dt_rank 4): purely recurrent.
- lfm2: 4 layers, short convolutions (l_cache 3) at 0, 1, 3 and attention at 2: hybrid, and one whose recurrent
  state llama.cpp can roll back.
- granitehybrid: 4 layers, Mamba-2 (d_inner 64, d_state 16, 4 SSM heads of 16, 1 group) at 0, 2, 3 and attention
  at 1: hybrid, without that rollback.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

VERSION = 1  # part of the cached file names: bump it when what a file holds changes
ARCHS = ("mamba", "lfm2", "granitehybrid")

N_CTX = 2048
N_EMBD = 32
N_FF = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
D_INNER = 2 * N_EMBD  # llama.cpp's Mamba and Granite loaders accept only an expansion factor of 2
D_STATE = 16
D_CONV = 4
DT_RANK = 4  # Mamba-1: about n_embd / 16; Mamba-2: the number of SSM heads
N_GROUP = 1
L_CACHE = 3  # LFM2's short convolution length
EMBD_STD = 0.02
RMS_EPS = 1e-5
ROPE_BASE = 10000.0

Tensors = list[tuple[str, np.ndarray]]


def file_name(arch: str) -> str:
    """The cache name of an arch's file: it carries VERSION, so a file from an older writer is never reused."""
    return f"tiny-{arch}-v{VERSION}.gguf"


class Random:
    """Draws tensors in a fixed order from one seeded generator and keeps them in that order."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.tensors: Tensors = []

    def put(self, name: str, value: np.ndarray) -> None:
        self.tensors.append((name, np.ascontiguousarray(value, dtype=np.float32)))

    def matrix(self, name: str, rows: int, cols: int, gain: float = 1.0) -> None:
        """A (rows, cols) weight in numpy order (llama.cpp's {cols, rows}): cols is the input size."""
        self.put(name, self.rng.normal(0.0, gain / np.sqrt(cols), (rows, cols)))

    def ones(self, name: str, *shape: int) -> None:
        self.put(name, np.ones(shape))

    def zeros(self, name: str, *shape: int) -> None:
        self.put(name, np.zeros(shape))

    def dt_bias(self, name: str, n: int) -> None:
        """Bias whose softplus is a step size in [0.001, 0.1], log-uniform: the range Mamba is trained from, where
        the state neither forgets at once nor never."""
        dt = np.exp(self.rng.uniform(np.log(1e-3), np.log(1e-1), n))
        self.put(name, dt + np.log(-np.expm1(-dt)))  # inverse softplus


def embeddings(r: Random, n_vocab: int) -> None:
    r.put("token_embd.weight", r.rng.normal(0.0, EMBD_STD, (n_vocab, N_EMBD)))


def _ffn(r: Random, b: str) -> None:
    r.ones(b + "ffn_norm.weight", N_EMBD)
    r.matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_up.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_down.weight", N_EMBD, N_FF)


def _attention(r: Random, b: str, qk_norm: bool = False) -> None:
    r.matrix(b + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
    if qk_norm:
        r.ones(b + "attn_q_norm.weight", HEAD_DIM)
        r.ones(b + "attn_k_norm.weight", HEAD_DIM)


def _mamba1(r: Random, b: str) -> None:
    """One Mamba-1 mixer: A = -(1..d_state) per channel (the usual S4D-real start), D = 1."""
    r.matrix(b + "ssm_in.weight", 2 * D_INNER, N_EMBD)
    r.matrix(b + "ssm_conv1d.weight", D_INNER, D_CONV)
    r.zeros(b + "ssm_conv1d.bias", D_INNER)
    r.matrix(b + "ssm_x.weight", DT_RANK + 2 * D_STATE, D_INNER)
    r.matrix(b + "ssm_dt.weight", D_INNER, DT_RANK)
    r.dt_bias(b + "ssm_dt.bias", D_INNER)
    r.put(b + "ssm_a", -np.tile(np.arange(1, D_STATE + 1), (D_INNER, 1)))
    r.ones(b + "ssm_d", D_INNER)
    r.matrix(b + "ssm_out.weight", N_EMBD, D_INNER)


def _mamba2(r: Random, b: str) -> None:
    """One Mamba-2 mixer: in_proj gives z, x, B, C and dt per head; A = -(1..n_heads), D = 1, grouped RMS norm."""
    conv_dim = D_INNER + 2 * N_GROUP * D_STATE
    r.matrix(b + "ssm_in.weight", D_INNER + conv_dim + DT_RANK, N_EMBD)
    r.matrix(b + "ssm_conv1d.weight", conv_dim, D_CONV)
    r.zeros(b + "ssm_conv1d.bias", conv_dim)
    r.dt_bias(b + "ssm_dt.bias", DT_RANK)
    r.put(b + "ssm_a", -np.arange(1, DT_RANK + 1).reshape(DT_RANK, 1))
    r.ones(b + "ssm_d", DT_RANK, 1)
    r.ones(b + "ssm_norm.weight", N_GROUP, D_INNER // N_GROUP)
    r.matrix(b + "ssm_out.weight", N_EMBD, D_INNER)


def _shortconv(r: Random, b: str) -> None:
    """One LFM2 short convolution: in_proj gives the gates B, C and the input x; the kernel is l_cache wide."""
    r.matrix(b + "shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD)
    r.matrix(b + "shortconv.conv.weight", N_EMBD, L_CACHE)
    r.matrix(b + "shortconv.out_proj.weight", N_EMBD, N_EMBD)


def _mamba(r: Random, n_vocab: int) -> dict[str, Any]:
    embeddings(r, n_vocab)
    r.ones("output_norm.weight", N_EMBD)
    n_layer = 2
    for i in range(n_layer):
        r.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        _mamba1(r, f"blk.{i}.")
    return {"block_count": n_layer, "feed_forward_length": 0, "attention.head_count": 0,
            "attention.head_count_kv": 0, "ssm.conv_kernel": D_CONV, "ssm.inner_size": D_INNER,
            "ssm.state_size": D_STATE, "ssm.time_step_rank": DT_RANK}


def _lfm2(r: Random, n_vocab: int) -> dict[str, Any]:
    embeddings(r, n_vocab)
    r.ones("token_embd_norm.weight", N_EMBD)  # LFM2's final norm goes by this name
    kv_heads = [0, 0, N_HEAD_KV, 0]  # 0: a short-convolution layer
    for i, n_kv in enumerate(kv_heads):
        b = f"blk.{i}."
        r.ones(b + "attn_norm.weight", N_EMBD)
        if n_kv:
            _attention(r, b, qk_norm=True)
        else:
            _shortconv(r, b)
        _ffn(r, b)
    return {"block_count": len(kv_heads), "feed_forward_length": N_FF, "attention.head_count": N_HEAD,
            "attention.head_count_kv": kv_heads, "shortconv.l_cache": L_CACHE, "rope.freq_base": ROPE_BASE}


def _granitehybrid(r: Random, n_vocab: int) -> dict[str, Any]:
    embeddings(r, n_vocab)
    r.ones("output_norm.weight", N_EMBD)
    kv_heads = [0, N_HEAD_KV, 0, 0]  # 0: a Mamba-2 layer
    for i, n_kv in enumerate(kv_heads):
        b = f"blk.{i}."
        r.ones(b + "attn_norm.weight", N_EMBD)
        if n_kv:
            _attention(r, b)
        else:
            _mamba2(r, b)
        _ffn(r, b)
    return {"block_count": len(kv_heads), "feed_forward_length": N_FF, "attention.head_count": N_HEAD,
            "attention.head_count_kv": kv_heads, "ssm.conv_kernel": D_CONV, "ssm.inner_size": D_INNER,
            "ssm.state_size": D_STATE, "ssm.time_step_rank": DT_RANK, "ssm.group_count": N_GROUP,
            "rope.freq_base": ROPE_BASE}


_BUILDERS: dict[str, Callable[[Random, int], dict[str, Any]]] = {
    "mamba": _mamba, "lfm2": _lfm2, "granitehybrid": _granitehybrid}


def _add_hparams(w: Any, arch: str, hparams: dict[str, Any], n_vocab: int) -> None:
    """The `<arch>.*` keys. llama.cpp reads scalar sizes as UINT32 only and per-layer lists as INT32 arrays."""
    keys: dict[str, Any] = {"context_length": N_CTX, "embedding_length": N_EMBD, "vocab_size": n_vocab,
                            "attention.layer_norm_rms_epsilon": RMS_EPS, **hparams}
    for key, value in keys.items():
        name = f"{arch}.{key}"
        if isinstance(value, list):
            w.add_array(name, value)
        elif isinstance(value, float):
            w.add_float32(name, value)
        else:
            w.add_uint32(name, value)


@lru_cache(maxsize=4)
def _tokenizer(path: Path, mtime_ns: int) -> tuple[tuple[str, Any, Any, Any], ...]:
    """The tokenizer keys of a GGUF, read once per file and process: reading them takes seconds (tens of
    thousands of tokens and merges), writing a model well under one."""
    from localspec.models.gguf_tools import tokenizer_fields

    return tuple(tokenizer_fields(path))


def read_tokenizer(tokenizer_from: Path) -> tuple[tuple[tuple[str, Any, Any, Any], ...], int]:
    """The tokenizer keys of the GGUF `tokenizer_from` (cached per file and process) and its vocabulary size: what
    every tiny writer copies, here and in tiny_rwkv6.py."""
    fields = _tokenizer(Path(tokenizer_from), Path(tokenizer_from).stat().st_mtime_ns)
    return fields, len(next(v for name, v, *_ in fields if name == "tokenizer.ggml.tokens"))


def write_tiny(arch: str, tokenizer_from: Path, out: Path, *, seed: int = 0) -> Path:
    """Write a tiny random `arch` model with the tokenizer of the GGUF `tokenizer_from` to `out`.

    Written under a temporary name and renamed, so a run cut short (or a parallel one) never leaves a half file
    under the real name.
    """

    if arch not in _BUILDERS:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {', '.join(ARCHS)}")
    fields, n_vocab = read_tokenizer(tokenizer_from)
    r = Random(seed)
    hparams = _BUILDERS[arch](r, n_vocab)

    return write_gguf(out, arch, f"localspec tiny {arch} v{VERSION} seed {seed}", hparams, n_vocab, fields,
                      r.tensors, lambda name: name == "token_embd.weight")


def write_gguf(out: str | Path, arch: str, title: str, hparams: dict, n_vocab: int, fields: list,
               tensors: list, f16: Callable[[str], bool]) -> Path:
    """Write a tiny model's header, tokenizer fields and tensors (those `f16` names stored as F16) under a
    temporary name, then rename it into place: a run cut short never leaves a half file under the real name."""
    import gguf

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f"{out.name}.{os.getpid()}.part")
    w = gguf.GGUFWriter(str(part), arch=arch)
    w.add_name(title)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _add_hparams(w, arch, hparams, n_vocab)
    for name, value, vtype, sub in fields:
        w.add_key_value(name, value, vtype, sub_type=sub)
    for name, data in tensors:
        w.add_tensor(name, data.astype(np.float16) if f16(name) else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.replace(out)
    return out


# -- qwen35 with one MTP (nextn) head ------------------------------------------------------------------------------
# Qwen3.5's layout, scaled down: 4 trunk layers, gated delta-net at 0, 1, 2 and gated full attention at 3
# (full_attention_interval 4), then one MTP block (llama.cpp's nextn layer: a full-attention block fed with the
# token's embedding and the trunk's last hidden state, through eh_proj). Its lm head and embeddings are the
# trunk's (no nextn.embed_tokens / shared_head_head), as in Qwen3.5's GGUFs.
QWEN35_TRUNK = 4
QWEN35_K_HEADS, QWEN35_V_HEADS = 2, 4  # gated delta-net key heads (ssm.group_count), value heads (time_step_rank)
QWEN35_ROT = 8  # rotary dims of a head (here all of them; Qwen3.5 rotates a quarter), in IMROPE sections of 2, 1, 1


def _qwen35_attention(r: Random, b: str) -> None:
    """Gated attention: attn_q gives the query and its output gate (2 × head_dim per head)."""
    r.ones(b + "attn_norm.weight", N_EMBD)
    r.ones(b + "post_attention_norm.weight", N_EMBD)
    r.matrix(b + "attn_q.weight", 2 * N_HEAD * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
    r.matrix(b + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
    r.ones(b + "attn_q_norm.weight", HEAD_DIM)
    r.ones(b + "attn_k_norm.weight", HEAD_DIM)


def _qwen35_delta_net(r: Random, b: str) -> None:
    """One gated delta-net mixer: head dims d_state (16), conv over q, k and v, decay gate -exp(A) · softplus."""
    key_dim, value_dim = D_STATE * QWEN35_K_HEADS, D_STATE * QWEN35_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    r.ones(b + "attn_norm.weight", N_EMBD)
    r.ones(b + "post_attention_norm.weight", N_EMBD)
    r.matrix(b + "attn_qkv.weight", conv_dim, N_EMBD)
    r.matrix(b + "attn_gate.weight", value_dim, N_EMBD)
    r.matrix(b + "ssm_conv1d.weight", conv_dim, D_CONV)
    r.dt_bias(b + "ssm_dt.bias", QWEN35_V_HEADS)
    r.put(b + "ssm_a", -np.exp(r.rng.uniform(-1.0, 1.0, QWEN35_V_HEADS)))
    r.matrix(b + "ssm_beta.weight", QWEN35_V_HEADS, N_EMBD)
    r.matrix(b + "ssm_alpha.weight", QWEN35_V_HEADS, N_EMBD)
    r.ones(b + "ssm_norm.weight", D_STATE)
    r.matrix(b + "ssm_out.weight", N_EMBD, value_dim)


def _qwen35_ffn(r: Random, b: str) -> None:
    r.matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_up.weight", N_FF, N_EMBD)
    r.matrix(b + "ffn_down.weight", N_EMBD, N_FF)


def _qwen35(r: Random, n_vocab: int) -> dict[str, Any]:
    embeddings(r, n_vocab)
    r.ones("output_norm.weight", N_EMBD)
    for i in range(QWEN35_TRUNK):
        b = f"blk.{i}."
        if (i + 1) % 4:
            _qwen35_delta_net(r, b)
        else:
            _qwen35_attention(r, b)
        _qwen35_ffn(r, b)
    b = f"blk.{QWEN35_TRUNK}."  # the MTP head
    _qwen35_attention(r, b)
    _qwen35_ffn(r, b)
    r.matrix(b + "nextn.eh_proj.weight", N_EMBD, 2 * N_EMBD)
    r.ones(b + "nextn.enorm.weight", N_EMBD)
    r.ones(b + "nextn.hnorm.weight", N_EMBD)
    r.ones(b + "nextn.shared_head_norm.weight", N_EMBD)
    return {"block_count": QWEN35_TRUNK + 1, "nextn_predict_layers": 1, "feed_forward_length": N_FF,
            "attention.head_count": N_HEAD, "attention.head_count_kv": N_HEAD_KV, "attention.key_length": HEAD_DIM,
            "attention.value_length": HEAD_DIM, "rope.dimension_count": QWEN35_ROT,
            "rope.dimension_sections": [2, 1, 1, 0], "rope.freq_base": ROPE_BASE, "full_attention_interval": 4,
            "ssm.conv_kernel": D_CONV, "ssm.inner_size": D_STATE * QWEN35_V_HEADS, "ssm.state_size": D_STATE,
            "ssm.time_step_rank": QWEN35_V_HEADS, "ssm.group_count": QWEN35_K_HEADS}


_BUILDERS["qwen35"] = _qwen35
ARCHS = (*ARCHS, "qwen35")


def write_qwen35_echo(tokenizer_from: Path, out: Path, *, seed: int = 0, noise: float = 0.0) -> Path:
    """The tiny qwen35 with every mixer's output projection zeroed, so its trunk is a bigram (the next token is a
    function of the last one: the residual stream is the token's embedding), and an MTP head whose eh_proj passes
    the token's normed embedding on (identity on that half, plus `noise` · N(0, 1/√(2·n_embd)) everywhere): with
    noise 0 the head predicts what the trunk will, so every draft is accepted; with some, drafts part from the
    trunk where its top choices are close. For acceptance counts that are neither 0 nor all."""

    fields, n_vocab = read_tokenizer(tokenizer_from)
    r = Random(seed)
    hparams = _qwen35(r, n_vocab)
    silent = ("ssm_out.weight", "attn_output.weight", "ffn_down.weight")
    eh = np.concatenate([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))], axis=1)
    eh = eh + noise * r.rng.normal(0.0, 1.0 / np.sqrt(2 * N_EMBD), eh.shape)
    tensors = [(name, np.zeros_like(v) if name.endswith(silent) else
                eh.astype(np.float32) if name.endswith("nextn.eh_proj.weight") else v) for name, v in r.tensors]
    # an lm head of its own: the embeddings in a shuffled order, so the bigram walks a long cycle of tokens instead
    # of settling on the one whose embedding is most like itself
    embd = dict(tensors)["token_embd.weight"]
    tensors.append(("output.weight", embd[r.rng.permutation(n_vocab)]))
    return write_gguf(out, "qwen35", f"localspec tiny qwen35 echo v{VERSION} seed {seed} noise {noise}", hparams,
                      n_vocab, fields, tensors, lambda name: name in ("token_embd.weight", "output.weight"))
