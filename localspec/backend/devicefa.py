"""Whether flash attention works on the GPU device a model's layers went to, found by a test in a child process.

llama.cpp turns flash attention on by itself where a device supports it (`--flash-attn auto`). Where a backend's
kernel is broken for a device (llama.cpp's Vulkan backend on Mesa's lavapipe: SIGSEGV in the driver's worker
thread on the first verify batch after a rewind), the process dies at its first speculative round, and no Python
code can catch that. So once per device, llama.cpp build and attention shape (head counts and sizes pick the
kernel: on lavapipe SmolLM2 dies where a 3-layer random model of another shape survives), a child process loads
the model on that device with flash attention on and decodes what speculation decodes (a prefix, one row, a
rewind, a few rows); a death by signal, an abort or a time-out turns flash attention off for models of that
shape on that device, said in one line. The verdict is cached beside the calibrations. A model on the CPU, or one
whose flash attention the user chose (`--flash-attn on|off`), is not tested. Measurements: docs/bench/gpu.md
("Vulkan on lavapipe").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import llama_cpp

from .ggml import build_info, devices, supports_gpu_offload
from .verdicts import read_verdict, write_verdict

SCHEMA = 1
TIMEOUT_ENV = "LOCALSPEC_FA_PROBE_TIMEOUT"  # seconds the test may take (default: by file size)
PREFIX, ROWS = 8, 3  # the test: an 8-token prefix, one row, a rewind to the prefix, then 3 rows at once
UNLOADABLE_EXIT = 3  # the test's exit status when the file would not load (the real load says why)


@dataclass(frozen=True)
class Verdict:
    """Flash attention on one device: whether its test survived, and how it died if not."""

    device: str  # "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits))"
    ok: bool
    how: str = ""  # "SIGSEGV", "timed out after 60 s": how the test died
    source: str = "probe"  # "probe" (tested this start) or "cache"

    def notice(self) -> str | None:
        """The one line for the user when flash attention was turned off, else None."""
        if self.ok:
            return None
        return (f"flash attention crashed a test on {self.device} ({self.how}): running without it on that device "
                "(--flash-attn on forces it)")

    def to_dict(self) -> dict:
        return {"device": self.device, "ok": self.ok, "how": self.how, "source": self.source}


def gpu_devices(model) -> tuple[str, ...]:
    """The local GPU devices a model's offloaded layers went to (RPC servers are other machines: not tested)."""
    if not model.options.n_gpu_layers or not supports_gpu_offload():
        return ()
    return tuple(d for d in model.offload_devices if not d.startswith("RPC"))


def _describe(names: Sequence[str]) -> str:
    known = {d["name"]: d["description"] for d in devices()}
    return ", ".join(f"{n} ({known[n]})" if known.get(n) else n for n in names)


def _library_id() -> dict:
    """The llama.cpp and ggml library files (every backend): a rebuild with other flags is another build."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    files = sorted([*lib.glob("libllama*"), *lib.glob("libggml*")])
    return {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.is_file() and not f.is_symlink()}


def attention_shape(model) -> dict:
    """What picks llama.cpp's flash-attention kernel for a model: head counts and sizes (GGUF metadata)."""
    meta = model.metadata()
    arch = meta.get("general.architecture", "")
    keys = ("embedding_length", "attention.head_count", "attention.head_count_kv", "attention.key_length",
            "attention.value_length", "attention.sliding_window")
    return {k: meta.get(f"{arch}.{k}") for k in keys if meta.get(f"{arch}.{k}") is not None}


def cache_key(device: str, shape: Mapping | None = None) -> dict:
    return {"schema": SCHEMA, "device": device, "shape": dict(shape or {}), "build": build_info(),
            "library": _library_id()}


def _timeout(path: Path) -> float:
    env = os.environ.get(TIMEOUT_ENV)
    return float(env) if env else 60.0 + 20.0 * path.stat().st_size / 1e9


def run_test(path: Path, n_gpu_layers: int, fast_path: str, timeout: float) -> str | None:
    """The test in a child: None if it survived (or the file would not load), else how it died."""
    from .fastpath import _died

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's localspec
    cmd = [sys.executable, "-m", "localspec.backend.devicefa_trial", str(path), str(n_gpu_layers), fast_path]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if proc.returncode in (0, UNLOADABLE_EXIT):
        return None
    last = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:80]
    return _died(proc.returncode) + (f": {last}" if proc.returncode > 0 and last else "")


def check(model) -> Verdict | None:
    """The verdict for the device `model`'s layers went to and its attention shape: cached, else tested now;
    None when there is nothing to test (a CPU model, or flash attention chosen by the user)."""
    devs = gpu_devices(model)
    if not devs or model.options.flash_attn is not None:
        return None
    device = _describe(devs)
    key = cache_key(device, attention_shape(model))
    cached = read_verdict("devicefa", key)
    if cached is not None and isinstance(cached.get("ok"), bool):
        return Verdict(device, cached["ok"], cached.get("how", ""), "cache")
    t0 = time.perf_counter()
    how = run_test(model.path, model.options.n_gpu_layers, model.fast_path.mode, _timeout(model.path))
    write_verdict("devicefa", key, {"ok": how is None, "how": how or "", "seconds": round(time.perf_counter() - t0, 3)})
    return Verdict(device, how is None, how or "")


_told: set[str] = set()


def settle(model, log: Callable[[str], object] = print) -> Verdict | None:
    """Test flash attention on `model`'s device (once per device, build and attention shape) and turn it off on
    `model` where the test died, saying so when the test ran (a cached verdict is applied quietly). Call right
    after the load, before anything is decoded."""
    v = check(model)
    if v is not None and not v.ok:
        model.set_flash_attn(False)
        notice = v.notice()
        if notice and v.source == "probe" and notice not in _told:  # said when found, as the CPU fast paths are
            _told.add(notice)
            log(f"localspec: {notice}")
    return v


def name_suspect(models: Sequence) -> None:
    """Tell the watching parent (commands/supervise.py) what to blame should llama.cpp crash later: flash attention
    on the first GPU device a model uses, or that device's backend where flash attention is off; nothing (the
    CPU's fast paths) when every model runs on the CPU."""
    from ..crash import note_suspect

    for m in models:
        devs = gpu_devices(m)
        if devs:
            if m.options.flash_attn is False:
                note_suspect(f"llama.cpp's {devs[0]} backend", "--ngl 0 (the model on the CPU)")
            else:
                note_suspect(f"flash attention on {devs[0]}", "--flash-attn off")
            return
    note_suspect(None)
