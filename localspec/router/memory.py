"""How much memory a runner will take, from its GGUF headers, before it starts: the router evicts idle models
or refuses the load when the estimate does not fit, instead of letting the kernel's OOM killer choose.

    weights  = the file's size, split between RAM and VRAM by the share of layers offloaded (--ngl)
    KV cache = the attention layers' cache at n_ctx, and a recurrent model's state, split the same way
               (llama.cpp keeps each layer's cache on that layer's device)
    compute  = llama.cpp's compute buffer for one micro-batch (the logits of 512 rows, or the attention scores
               of a long context), on the GPU when any layer is offloaded and in RAM when any is not
    process  = a fixed allowance for Python, numpy, the HTTP server and llama.cpp's code

The first three come from models/footprint.py, which says how llama.cpp sizes each buffer. A drafter (a pair's,
or --draft) is added the same way. The figure is an estimate: mmap'd weights share the page cache.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..models.footprint import footprint
from ..models.gguf_header import read_header
from .discover import ModelSpec, context_for

# A SmolLM2-135M runner measured 105 MB resident beside its weights and KV cache at n_ctx 256, 122 MB at 2048
# (VmHWM after an answer).
PROCESS_BYTES = 150_000_000


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
    """One model's weights, KV cache (and recurrent state) and compute buffer, placed by the offloaded share
    (no process allowance). With some layers on each side both llama.cpp's CPU and GPU compute buffers exist;
    each is counted whole, which is high rather than low."""
    p = Path(path)
    share = offloaded_share(p, ngl)
    f = footprint(p, n_ctx, type_k=type_k, type_v=type_v)
    layered = f.weights + f.kv + f.state
    vram = int(layered * share) + (f.compute if share > 0 else 0)
    ram = layered - int(layered * share) + (f.compute if share < 1 else 0)
    return Estimate(ram, vram)


def estimate(path: str | Path, n_ctx: int, ngl: int | None = 0, *, draft: str | Path | None = None,
             ngl_draft: int | None = None, type_k: int | None = None, type_v: int | None = None) -> Estimate:
    """A runner's memory: the target, its drafter (same n_ctx; --ngl-draft defaults to --ngl) and the process."""
    total = model_estimate(path, n_ctx, ngl, type_k=type_k, type_v=type_v) + Estimate(PROCESS_BYTES, 0)
    if draft is not None:
        total = total + model_estimate(draft, n_ctx, ngl if ngl_draft is None else ngl_draft,
                                       type_k=type_k, type_v=type_v)
    return total


# The device list, read in a child process: asking a CUDA device for its free memory creates a CUDA context,
# which would hold a few hundred MB of that GPU in the router for as long as it runs.
_DEVICES = ("import json; from localspec.backend.ggml import devices; "
            "print(json.dumps([d for d in devices() if d['type'] in ('GPU', 'IGPU') and d['backend'] != 'RPC']))")


def free_vram_bytes() -> int | None:
    """Free memory over the GPUs this machine shows (llama.cpp splits offloaded layers over all of them): ggml's
    own device list, whatever the backend (CUDA, Vulkan, Metal), else nvidia-smi; None where neither can say."""
    free = ggml_free_bytes()
    return free if free is not None else nvidia_smi_free_bytes()


def ggml_free_bytes(timeout: float = 60.0) -> int | None:
    """The free memory ggml reports for its local GPU devices (RPC servers are not this machine's), from a short
    child process; None when it lists none (a CPU build) or cannot run."""
    try:
        out = subprocess.run([sys.executable, "-c", _DEVICES], capture_output=True, text=True, timeout=timeout,
                             check=True).stdout
        gpus = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return sum(int(d["free"]) for d in gpus) if gpus else None


def nvidia_smi_free_bytes() -> int | None:
    """Free memory over the NVIDIA GPUs, from nvidia-smi; None where there is none to ask."""
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
    return (f"cannot load {name}: it needs about {gb(wanted)} of {what} (weights, KV cache and compute buffer at "
            f"n_ctx {n_ctx}), {gb(free)} is free and no idle model is left to unload; try a smaller --ctx or fewer "
            "models")
