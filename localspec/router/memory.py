"""How much memory a runner will take, from its GGUF headers, before it starts: the router evicts idle models
or refuses the load when the estimate does not fit, instead of letting the kernel's OOM killer choose.

    weights  = the file's size, split between RAM and VRAM by the share of layers offloaded (--ngl)
    KV cache = model_facts.kv_cache_bytes(n_ctx): Σ_layers n_ctx · n_head_kv · (d_k + d_v) · 2 bytes (f16),
               on the GPU for offloaded layers (llama.cpp's default), split the same way
    compute  = n_ctx · n_ubatch · n_head · 4 bytes: the attention scores of one prompt batch (without flash
               attention), the part of llama.cpp's compute buffer that grows with the context
    process  = a fixed allowance for Python, numpy, the HTTP server and llama.cpp's code

A drafter (a pair's, or --draft) is added the same way. The figure is an estimate: mmap'd weights share the
page cache, and a sliding-window model (Gemma 3) uses less KV cache than its n_ctx implies.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..models.gguf_header import read_header
from ..models.model_facts import kv_cache_bytes
from .discover import ModelSpec, context_for

# A SmolLM2-135M runner measured 105 MB resident beside its weights and KV cache at n_ctx 256, 122 MB at 2048
# (VmHWM after an answer); with the compute term below the estimate is 1.2-1.3x what it used.
PROCESS_BYTES = 150_000_000
N_UBATCH = 512  # llama.cpp's default micro-batch: the prompt rows one compute pass holds


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


def compute_bytes(path: str | Path, n_ctx: int) -> int:
    """The attention scores of one micro-batch of prompt rows against the whole context, in f32."""
    kv = read_header(path, tokens=False).kv
    heads = kv.get(f"{kv.get('general.architecture', '?')}.attention.head_count") or 0
    n_head = max(heads) if isinstance(heads, (tuple, list)) else int(heads)
    return n_ctx * min(N_UBATCH, n_ctx) * n_head * 4


def model_estimate(path: str | Path, n_ctx: int, ngl: int | None = 0, *, type_k: int | None = None,
                   type_v: int | None = None) -> Estimate:
    """One model's weights and KV cache, split by the offloaded share (no process allowance)."""
    p = Path(path)
    share = offloaded_share(p, ngl)
    total = p.stat().st_size + kv_cache_bytes(p, n_ctx, type_k=type_k, type_v=type_v) + compute_bytes(p, n_ctx)
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


def free_vram_bytes() -> int | None:
    """Free memory over the NVIDIA GPUs this machine shows (llama.cpp splits offloaded layers over all of them),
    from nvidia-smi; None where there is none to ask (the router never loads llama.cpp to find out)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
        return sum(int(x) for x in out.split()) * 2**20 or None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def spec_estimate(spec: ModelSpec) -> Estimate | None:
    """The memory a spec's runner will take; None when its file is not on disk yet (fetched by the runner)."""
    if spec.path is None or not spec.path.is_file():
        return None
    draft = spec.draft_path if spec.draft_path is not None and spec.draft_path.is_file() else None
    return estimate(spec.path, spec.n_ctx or context_for(spec.path, None), spec.ngl, draft=draft)


def gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.1f} GB"


def fits(wanted: int, free: int | None) -> bool:
    return free is None or wanted <= free  # None: this machine cannot say, so the load is tried


def refusal(name: str, what: str, wanted: int, free: int | None, n_ctx: int | None) -> str:
    """The one line a caller reads when a model cannot be loaded for lack of `what` (memory, GPU memory)."""
    return (f"cannot load {name}: it needs about {gb(wanted)} of {what} (weights, KV cache at n_ctx {n_ctx}), "
            f"{gb(free)} is free and no idle model is left to unload; try a smaller --ctx or fewer models")
