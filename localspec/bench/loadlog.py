"""Where llama.cpp put each model load, read from its verbose load log (`localspec run --verbose`).

The GPU check (scripts/gpu/gpu_check.py) reads placement this way rather than trusting the options it passed: per
load, "offloaded N/M layers to GPU" (GPU builds only), "layer i assigned to device X", "X model buffer size",
"X KV buffer size" and "X compute buffer size" are what llama.cpp actually did, whatever the backend names its
device (CUDA0, Vulkan0, MTL0, ROCm0).
"""

from __future__ import annotations

import re

_LOAD = re.compile(r"loaded meta data with \d+ key-value pairs and \d+ tensors from (.+?) \(version")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_LAYER = re.compile(r"layer +(\d+) assigned to device (\S+?),")
_MODEL_BUF = re.compile(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB")
_KV_BUF = re.compile(r"llama_kv_cache: +(\S+) KV buffer size = +([\d.]+) MiB")
_RS_BUF = re.compile(r"llama_memory_recurrent: +(\S+) RS buffer size = +([\d.]+) MiB")
_COMPUTE_BUF = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB")
_USING = re.compile(r"using device (\S+) \((.*)\) \([^()]*\) - (\d+) MiB free")


def parse_load_log(text: str) -> list[dict]:
    """One dict per model load, in load order: path, the GPU devices it was given (name -> description, free
    MiB), layers offloaded (GPU builds), the device of every layer, model buffers (MiB per buffer type), KV cache,
    recurrent state ("RS") and compute buffers (first context of that load)."""
    loads: list[dict] = []
    cur: dict | None = None
    using: dict[str, dict] = {}  # "using device X (description) (id) - N MiB free" seen before a load
    for line in text.splitlines():
        if m := _USING.search(line):
            dev = {"description": m.group(2), "free_mib": int(m.group(3))}
            if cur is not None and not cur["layers"] and not cur["model_buffers"]:
                cur["devices"][m.group(1)] = dev  # llama.cpp 0.3.36: after the metadata, before the tensors
            else:
                using[m.group(1)] = dev  # older builds: before the load's first line
            continue
        if m := _LOAD.search(line):
            cur = {"path": m.group(1), "offloaded": None, "layers": {}, "model_buffers": {}, "kv_buffers": {},
                   "rs_buffers": {}, "compute_buffers": {}, "devices": using}
            loads.append(cur)
            using = {}
            continue
        if cur is None:
            continue
        if m := _OFFLOADED.search(line):
            cur["offloaded"] = [int(m.group(1)), int(m.group(2))]
        elif m := _LAYER.search(line):
            cur["layers"][int(m.group(1))] = m.group(2)
        elif m := _MODEL_BUF.search(line):
            cur["model_buffers"][m.group(1)] = float(m.group(2))
        elif (m := (_KV_BUF.search(line) or _RS_BUF.search(line))) and not cur.get("_kv_done"):
            into = cur["kv_buffers" if "KV buffer" in line else "rs_buffers"]  # a sliding-window model has two caches
            into[m.group(1)] = into.get(m.group(1), 0.0) + float(m.group(2))
        elif (m := _COMPUTE_BUF.search(line)) and not cur.get("_compute_done"):
            cur["compute_buffers"][m.group(1)] = float(m.group(2))
            cur["_kv_done"] = cur["_compute_done"] = True  # later contexts (flash-attention timing) repeat these
    for d in loads:
        d.pop("_kv_done", None)
        d.pop("_compute_done", None)
        devs = sorted(set(d["layers"].values()))
        d["layer_devices"] = {dev: sum(1 for v in d["layers"].values() if v == dev) for dev in devs}
        d["n_layers"] = len(d["layers"])
        d.pop("layers")
    return loads


def on_cpu(name: str) -> bool:
    """A buffer or device name that is host memory: CPU, CPU_Mapped, CPU_REPACK, AMX, or a GPU backend's pinned
    host buffer (CUDA_Host, Vulkan_Host)."""
    return name.startswith("CPU") or name == "AMX" or name.endswith("_Host")


def placement_ok(load: dict, gpu: bool, device: str | None = None) -> tuple[bool, str]:
    """All layers and the KV cache on one GPU device (gpu: CUDA0, Vulkan0, MTL0, ... or `device` by name), or
    all on the CPU."""
    devs, kv, off = load["layer_devices"], load["kv_buffers"], load["offloaded"]
    if gpu:
        gpus = {d for d in devs if not on_cpu(d)} if device is None else {device}
        ok = (off is not None and off[0] == off[1] and len(gpus) == 1
              and sum(devs.get(d, 0) for d in gpus) == load["n_layers"] > 0
              and any(k in gpus for k in kv) and not any(on_cpu(k) for k in kv)
              and any(b in gpus for b in load["model_buffers"]))
    else:
        ok = set(devs) == {"CPU"} and set(kv) <= {"CPU"} and bool(kv)
    how = (f"offloaded {off[0]}/{off[1]}" if off else "no offload line") + \
        f"; layers {devs}; KV {kv}; model buffers {load['model_buffers']}"
    return ok, how
