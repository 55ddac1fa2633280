"""How much memory a runner will take, from its GGUF headers, before it starts: the router evicts idle models
or refuses the load when the estimate does not fit, instead of letting the kernel's OOM killer choose.

    weights  = the file's size, split between RAM and VRAM by the share of layers offloaded (--ngl)
    KV cache = model_facts.kv_cache_bytes(n_ctx): Σ_layers n_ctx · n_head_kv · (d_k + d_v) · 2 bytes (f16),
               on the GPU for offloaded layers (llama.cpp's default), split the same way
    process  = a fixed allowance for the Python process, llama.cpp's compute buffers and the HTTP server

A drafter (a pair's, or --draft) is added the same way. The figure is an estimate: mmap'd weights share the
page cache, and a sliding-window model (Gemma 3) uses less KV cache than its n_ctx implies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..models.gguf_header import read_header
from ..models.model_facts import kv_cache_bytes

PROCESS_BYTES = 300_000_000  # a runner with a 135M model measures ~250 MB resident beside its weights


@dataclass(frozen=True)
class Estimate:
    ram_bytes: int
    vram_bytes: int

    def __add__(self, other: "Estimate") -> "Estimate":
        return Estimate(self.ram_bytes + other.ram_bytes, self.vram_bytes + other.vram_bytes)


def offloaded_share(path: str | Path, ngl: int | None) -> float:
    """The share of a model's layers on the GPU: llama.cpp counts n_layer + 1 (the output layer) for -ngl;
    -1 (or more than there are) means all."""
    if not ngl:
        return 0.0
    kv = read_header(path, tokens=False).kv
    n_layer = kv.get(f"{kv.get('general.architecture', '?')}.block_count") or 0
    if ngl < 0 or not n_layer or ngl >= n_layer + 1:
        return 1.0
    return ngl / (n_layer + 1)


def model_estimate(path: str | Path, n_ctx: int, ngl: int | None = 0, *, type_k: int | None = None,
                   type_v: int | None = None) -> Estimate:
    """One model's weights and KV cache, split by the offloaded share (no process allowance)."""
    p = Path(path)
    share = offloaded_share(p, ngl)
    total = p.stat().st_size + kv_cache_bytes(p, n_ctx, type_k=type_k, type_v=type_v)
    vram = int(total * share)
    return Estimate(total - vram, vram)


def estimate(path: str | Path, n_ctx: int, ngl: int | None = 0, *, draft: str | Path | None = None,
             ngl_draft: int | None = None, type_k: int | None = None, type_v: int | None = None) -> Estimate:
    """A runner's memory: the target, its drafter (same n_ctx; --ngl-draft defaults to --ngl) and the process."""
    total = model_estimate(path, n_ctx, ngl, type_k=type_k, type_v=type_v) + Estimate(PROCESS_BYTES, 0)
    if draft is not None:
        total = total + model_estimate(draft, n_ctx, ngl if ngl_draft is None else ngl_draft,
                                       type_k=type_k, type_v=type_v)
    return total
