"""The memory llama.cpp allocates for a model at a context length, from the GGUF header alone: the weights, the KV
cache, the recurrent state and the compute buffer. The router (router/memory.py) adds these up before it starts a
runner, so it must not load the model (or llama.cpp) to find out.

The compute buffer is what llama.cpp's scheduler reserves for its worst-case graph (llama-context.cpp,
`sched_reserve`): one micro-batch of T = min(n_ctx, n_ubatch) prompt rows, every row's logits asked for. ggml's
allocator reuses a tensor's memory once its last reader has run, so the buffer is about the largest set of
tensors alive at one time, which is the largest of these phases (f32 throughout):

    output     T · n_vocab (the logits) + 2 · T · n_embd
    attention  T · n_kv · n_head (the scores, softmax in place; none with flash attention) + T · n_kv (the mask)
               + 6 · T · max(n_embd, n_head · d_k)
    ffn        3 · T · n_ff (gate, up, their product; in a mixture of experts, those a token uses) + 2 · T · n_embd
    recurrent  6 · T · d_inner + 2 · the states of every sequence

Measured against llama.cpp's own load log (tests/test_footprint.py) the largest phase is within a few percent of
the buffer it reports; COMPUTE_MARGIN covers the rest (the allocator's fragmentation, small tensors not counted).
The attention scores are counted even where flash attention will be on (llama.cpp decides that at load), so a long
context's estimate is high there rather than low.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf_header import read_header

F32 = 4
F16 = 1  # ggml type id of the default KV cache type
N_UBATCH = 512  # backend/loading.py's n_batch, which it passes as the micro-batch too
COMPUTE_MARGIN = 1.25
# backend/rollback.py: a recurrent state is kept for 1 + SLOTS sequences, or for 1 + RS_DEPTH per-token snapshots
# where llama.cpp rolls the architecture back itself (llama-arch.cpp, llm_arch_supports_rs_rollback).
STATE_SEQS = 1 + 3
STATE_SNAPSHOTS = 1 + 8
RS_ROLLBACK_ARCHS = ("kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
                     "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3")
RECURRENT_ARCHS = ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")  # every layer recurrent
ALL_LAYERS_BOTH = ("falcon-h1",)  # every layer has attention and a state
PER_LAYER = ("attention.head_count", "attention.head_count_kv", "feed_forward_length", "attention.recurrent_layers")


def _per_layer(v: Any, n_layer: int) -> list[int]:
    """A per-layer count that GGUF stores either as one int or as an array (e.g. head_count_kv of hybrid models)."""
    return [int(x) for x in v] if isinstance(v, (tuple, list)) else [int(v)] * n_layer


def _type_bytes(ggml_type: int | None) -> float:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(F16 if ggml_type is None else ggml_type)]
    return size / block


@dataclass(frozen=True)
class Footprint:
    """Bytes llama.cpp allocates for one model and context, by buffer."""

    weights: int  # the file: llama.cpp's model buffers hold its tensor data
    kv: int  # the KV cache of the attention layers
    state: int  # the recurrent layers' state (llama.cpp's "RS buffer"), every sequence and snapshot
    compute: int  # the scheduler's compute buffer, with COMPUTE_MARGIN

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.state + self.compute


def _padded(n_ctx: int) -> int:
    """llama.cpp rounds the context up to a multiple of 256 cells (llama-context.cpp)."""
    return -(-n_ctx // 256) * 256


class _Shape:
    """The header's hyperparameters, read once; every count is per layer where GGUF may store an array."""

    def __init__(self, kv: dict[str, Any], n_vocab: int) -> None:
        self.kv = kv
        self.arch = str(kv.get("general.architecture", "?"))
        g = self.g
        self.n_layer = int(g("block_count") or 0)
        self.n_embd = int(g("embedding_length") or 0)
        self.n_vocab = n_vocab or int(g("vocab_size") or 0)
        self.heads = _per_layer(g("attention.head_count"), self.n_layer)
        kv_heads = g("attention.head_count_kv", None)
        self.kv_heads = _per_layer(g("attention.head_count") if kv_heads is None else kv_heads, self.n_layer)
        self.n_ff = _per_layer(g("feed_forward_length"), self.n_layer)
        self.recurrent = self._recurrent_layers()

    def g(self, key: str, default: Any = 0) -> Any:
        """The architecture's value for `key` ("block_count" is "llama.block_count" in a Llama file)."""
        return self.kv.get(f"{self.arch}.{key}", default)

    def _recurrent_layers(self) -> list[bool]:
        """Which layers keep a recurrent state, by llama.cpp's rules for each family (src/models/*.cpp)."""
        n, g = self.n_layer, self.g
        if self.arch in RECURRENT_ARCHS or self.arch in ALL_LAYERS_BOTH:
            return [True] * n
        listed = g("attention.recurrent_layers", None)
        if isinstance(listed, (tuple, list)):
            return [bool(x) for x in listed][:n]
        interval = int(g("full_attention_interval") or 0)
        if interval:
            return [(i + 1) % interval != 0 for i in range(n)]
        if not (g("ssm.conv_kernel") or g("shortconv.l_cache") or g("wkv.head_size")):
            return [False] * n  # an attention model: a layer without KV heads is only an MLP
        nemotron = self.arch.startswith("nemotron_h")
        return [kvh == 0 and not (nemotron and ff) for kvh, ff in zip(self.kv_heads, self.n_ff)]

    def head_dims(self, n_head: int) -> tuple[int, int]:
        emb = self.n_embd // n_head if n_head else 0
        return int(self.g("attention.key_length") or emb), int(self.g("attention.value_length") or emb)

    def state_row(self) -> int:
        """Floats of one sequence's state in one recurrent layer: llama.cpp's n_embd_r + n_embd_s
        (llama-hparams.cpp): RWKV's token shifts and wkv state, LFM2's short convolution, or Mamba's convolution
        and SSM state (which Qwen3.5's and Qwen3-Next's gated delta nets share)."""
        g, n_embd = self.g, self.n_embd
        if g("wkv.head_size"):
            return int(g("token_shift_count") or 2) * n_embd + n_embd * int(g("wkv.head_size"))
        if g("shortconv.l_cache"):
            return n_embd * (int(g("shortconv.l_cache")) - 1)
        d_conv, d_inner = int(g("ssm.conv_kernel") or 0), int(g("ssm.inner_size") or 0)
        d_state, n_group = int(g("ssm.state_size") or 0), int(g("ssm.group_count") or 0)
        return max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner

    def ff_rows(self) -> int:
        """The widest feed-forward a row passes through: the dense n_ff, or the experts a token uses plus the
        shared expert."""
        used = int(self.g("expert_used_count") or 0)
        experts = used * int(self.g("expert_feed_forward_length") or 0)
        experts += int(self.g("expert_shared_feed_forward_length") or 0)
        return max([experts, *self.n_ff])


def kv_bytes(s: _Shape, n_kv: int, type_k: int | None, type_v: int | None) -> int:
    """Σ over the attention layers of n_kv · n_head_kv · (d_k · |K| + d_v · |V|)."""
    total = 0.0
    for n_head, n_kv_head, recurrent in zip(s.heads, s.kv_heads, s.recurrent):
        if recurrent and s.arch not in ALL_LAYERS_BOTH or not n_head or not n_kv_head:
            continue
        d_k, d_v = s.head_dims(n_head)
        total += n_kv * n_kv_head * (d_k * _type_bytes(type_k) + d_v * _type_bytes(type_v))
    return int(total)


def state_bytes(s: _Shape) -> int:
    """The recurrent layers' f32 state for every sequence or snapshot localspec's context asks for."""
    planes = STATE_SNAPSHOTS if s.arch in RS_ROLLBACK_ARCHS else STATE_SEQS
    return sum(s.recurrent) * s.state_row() * F32 * planes


def compute_bytes(s: _Shape, n_kv: int, n_ubatch: int = N_UBATCH) -> int:
    """The largest phase of the worst-case graph (the module's docstring), with COMPUTE_MARGIN."""
    t = min(n_kv, n_ubatch)
    act = t * s.n_embd * F32
    n_head = max(s.heads, default=0)
    output = t * s.n_vocab * F32 + 2 * act
    attention = 0
    if not all(s.recurrent) or s.arch in ALL_LAYERS_BOTH:
        width = max(s.n_embd, n_head * s.head_dims(n_head)[0])
        attention = t * n_kv * (n_head + 1) * F32 + 6 * t * width * F32
    ffn = 3 * t * s.ff_rows() * F32 + 2 * act
    recurrent = 0
    if any(s.recurrent):
        d_inner = int(s.g("ssm.inner_size") or 0) or 2 * s.n_embd
        recurrent = 6 * t * d_inner * F32 + 2 * s.state_row() * F32 * STATE_SNAPSHOTS
    return int(COMPUTE_MARGIN * max(output, attention, ffn, recurrent))


def footprint(path: str | Path, n_ctx: int, *, n_ubatch: int = N_UBATCH, type_k: int | None = None,
              type_v: int | None = None) -> Footprint:
    """What llama.cpp will allocate for `path` at `n_ctx` (KV cache types as ggml type ids, None: f16)."""
    p = Path(path)
    h = read_header(p, tokens=False)
    arch = h.kv.get("general.architecture", "?")
    per_layer = tuple(f"{arch}.{k}" for k in PER_LAYER)
    if any(k in h.array_lengths for k in per_layer):  # a hybrid's layers differ: read those arrays too
        h = read_header(p, tokens=False, keep=per_layer)
    s = _Shape(h.kv, h.array_lengths.get("tokenizer.ggml.tokens", 0))
    n_kv = _padded(n_ctx)
    return Footprint(p.stat().st_size, kv_bytes(s, n_kv, type_k, type_v), state_bytes(s),
                     compute_bytes(s, n_kv, n_ubatch))
