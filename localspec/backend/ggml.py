"""ggml's side of llama.cpp: backend start-up and its log, system info, devices and RPC servers.

Why a module: which devices a model's layers go to, and which remote RPC servers are registered, is process-wide
state in ggml's backend registry (reached through the libggml that libllama uses, `_ggml`), not a property of one
model. `model.py` asks it for the device list of each load (`_devices_param`); `localspec models show --device`
and the server's /props read it directly.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path
from typing import Sequence

import llama_cpp
from llama_cpp import _logger

from ..errors import ModelLoadError
from ..models import rpc

_backend_ready = False
_verbose = False  # llama.cpp's log on stderr (--verbose); the last load's choice


@llama_cpp.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log goes to stderr only with --verbose: our errors are one line of our own."""
    if _verbose:
        sys.stderr.write(text.decode("utf-8", "replace"))


def _init_backend(verbose: bool) -> None:
    global _backend_ready, _verbose
    _verbose = verbose
    _logger.set_verbose(verbose)
    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", "replace")


def build_info() -> str:
    """Which llama.cpp this is (calibration results are cached per build): package version + CPU features."""
    return f"llama-cpp-python {llama_cpp.__version__}; {system_info().strip()}"


@functools.lru_cache(maxsize=None)
def llama_build() -> str:
    """llama.cpp's build in llama-server's `b<build>-<commit>` shape (its system_fingerprint and build_info). The
    wheel keeps the commit it was built from (ggml_commit) but not llama.cpp's build number: that reads 0."""
    f = _ggml().ggml_commit
    f.restype = ctypes.c_char_p
    commit = (f() or b"unknown").decode().removesuffix("-dirty")
    return f"b0-{commit}"


# -- devices and RPC (ggml's backend registry, through the libggml that libllama uses) -----------------------------
#
# Which devices a model's offloaded layers (and their KV cache) go to is llama.cpp's `llama_model_params.devices`,
# a NULL-terminated ggml_backend_dev_t array. NULL means llama.cpp's default: every registered device of type GPU,
# RPC ones first ("to minimize network transfers"), then local GPUs, then integrated GPUs if there is no discrete
# one (src/llama.cpp, llama_prepare_model_devices). localspec passes NULL unless an RPC server is registered in
# this process; then it passes the same list restricted to the RPC servers this model asked for, so a drafter
# loaded without --rpc stays local. --tensor-split proportions follow that order: RPC devices, then local GPUs.

_DEV_TYPES = ("CPU", "GPU", "IGPU", "ACCEL", "META")  # enum ggml_backend_dev_type
_rpc_devices: dict[str, list[int]] = {}  # endpoint -> its ggml devices, in registration order


class _DevProps(ctypes.Structure):
    """struct ggml_backend_dev_props up to device_id; `caps` is over-sized so a newer ggml cannot overrun it."""

    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", ctypes.c_bool * 32)]


@functools.lru_cache(maxsize=None)
def _ggml() -> ctypes.CDLL:
    """libggml as libllama loaded it. A wheel stores libggml.so and libggml.so.0 as two files, and
    llama_cpp._ggml loads the first: a second backend registry that llama.cpp never reads (why --rpc devices
    were once registered but never used). Loading libllama's soname returns libllama's own copy."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    sonames = sorted([*lib.glob("libggml.so.[0-9]*"), *lib.glob("libggml.[0-9]*.dylib")], key=lambda p: len(p.name))
    if sonames:  # libggml.so.0 before libggml.so.0.25.3
        g = ctypes.CDLL(str(sonames[0]))
    else:
        from llama_cpp._ggml import libggml as g
    c, vp = ctypes, ctypes.c_void_p
    for name, res, args in (
            ("ggml_backend_dev_count", c.c_size_t, []), ("ggml_backend_dev_get", vp, [c.c_size_t]),
            ("ggml_backend_dev_name", c.c_char_p, [vp]), ("ggml_backend_dev_description", c.c_char_p, [vp]),
            ("ggml_backend_dev_type", c.c_int, [vp]), ("ggml_backend_dev_backend_reg", vp, [vp]),
            ("ggml_backend_dev_memory", None, [vp, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)]),
            ("ggml_backend_dev_get_props", None, [vp, c.POINTER(_DevProps)]),
            ("ggml_backend_reg_name", c.c_char_p, [vp]), ("ggml_backend_reg_by_name", vp, [c.c_char_p]),
            ("ggml_backend_reg_dev_count", c.c_size_t, [vp]), ("ggml_backend_reg_dev_get", vp, [vp, c.c_size_t]),
            ("ggml_backend_reg_get_proc_address", vp, [vp, c.c_char_p]), ("ggml_backend_register", None, [vp]),
            ("ggml_backend_dev_by_type", vp, [c.c_int]), ("ggml_backend_buft_name", c.c_char_p, [vp])):
        f = getattr(g, name)
        f.restype, f.argtypes = res, args
    return g


def supports_rpc() -> bool:
    return bool(llama_cpp.llama_supports_rpc())


def _memory(g, d: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def _describe(g, d: int) -> dict:
    free, total = _memory(g, d)
    return {"name": g.ggml_backend_dev_name(d).decode(), "description": g.ggml_backend_dev_description(d).decode(),
            "type": _DEV_TYPES[g.ggml_backend_dev_type(d)],
            "backend": g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(d)).decode(),
            "free": free, "total": total}


def devices() -> list[dict]:
    """ggml's devices (CPU, CUDA0, Metal, RPC0 = a server added by --rpc, ...) with their memory in bytes.
    An RPC device's memory is what its server reports (one round trip)."""
    _init_backend(_verbose)
    g = _ggml()
    return [_describe(g, g.ggml_backend_dev_get(i)) for i in range(g.ggml_backend_dev_count())]


def add_rpc_servers(endpoints: Sequence[str], *, timeout: float = rpc.PROBE_TIMEOUT_S) -> list[dict]:
    """Register remote ggml-rpc-server devices as llama.cpp's --rpc does (ggml_backend_rpc_add_server), after
    probing each endpoint (llama.cpp's client aborts the process on a dead one). Returns their devices.

    llama-cpp-python 0.3.36 has no rpc_servers parameter; the RPC backend exposes this through ggml's registry.
    """
    if not supports_rpc():
        raise ModelLoadError("--rpc needs llama-cpp-python built with the RPC backend: "
                             'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
                             "llama-cpp-python (see docs/models.md)")
    eps = [str(e) for e in rpc.parse_endpoints(endpoints)]
    _init_backend(_verbose)
    g = _ggml()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    fn = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not fn:
        raise ModelLoadError("this llama.cpp build's RPC backend has no ggml_backend_rpc_add_server; "
                             "update llama-cpp-python")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(fn)
    for ep in eps:
        if ep not in _rpc_devices:
            rpc.probe(rpc.parse_endpoint(ep), timeout)
            _rpc_devices[ep] = _register(g, add_server, ep)
    out = [_describe(g, d) for ep in eps for d in _rpc_devices[ep]]
    empty = [d for d in out if d["total"] == 0]
    if empty:
        raise ModelLoadError(f"--rpc {empty[0]['description']}: the rpc server reports no memory on "
                             f"{empty[0]['name']}; restart ggml-rpc-server")
    return out


def serve_rpc(endpoint: str, n_threads: int = 1) -> None:
    """Serve this machine's CPU as an RPC device at `endpoint`, forever: what ggml-rpc-server does without
    accelerators (the same ggml_backend_rpc_start_server), for tests on machines without that binary."""
    _init_backend(_verbose)
    g = _ggml()
    fn = g.ggml_backend_reg_get_proc_address(g.ggml_backend_reg_by_name(b"RPC"), b"ggml_backend_rpc_start_server")
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_void_p))(fn)
    cpu = next(d for d in (g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count()))
               if g.ggml_backend_dev_type(d) == _DEV_TYPES.index("CPU"))
    start(endpoint.encode(), None, n_threads, 1, (ctypes.c_void_p * 1)(cpu))


def extra_buffer_types() -> dict[str, int]:
    """The CPU device's extra buffer types, {name: ggml_backend_buffer_type_t}, in llama.cpp's order of
    preference (AMX, KleidiAI, CPU_REPACK, ... as this build has them): what `use_extra_bufts` turns on."""
    _init_backend(_verbose)
    g = _ggml()
    cpu = g.ggml_backend_dev_by_type(_DEV_TYPES.index("CPU"))
    fn = g.ggml_backend_reg_get_proc_address(g.ggml_backend_dev_backend_reg(cpu),
                                             b"ggml_backend_dev_get_extra_bufts") if cpu else None
    if not fn:
        return {}
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(cpu)
    out: dict[str, int] = {}
    i = 0
    while bufts and bufts[i]:
        out[g.ggml_backend_buft_name(bufts[i]).decode()] = bufts[i]
        i += 1
    return out


def _register(g, add_server, ep: str) -> list[int]:
    reg = add_server(ep.encode())
    if not reg:
        raise ModelLoadError(f"--rpc {ep}: the rpc server has no devices; restart ggml-rpc-server with a backend")
    g.ggml_backend_register(reg)
    return [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]


def _offload_devices(rpc_servers: Sequence[str]) -> list[int]:
    """llama.cpp's default device choice (see above), with only these RPC servers' devices, in --rpc order."""
    g = _ggml()
    gpus: list[int] = []
    igpus: list[int] = []
    seen_ids: set[bytes] = set()
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        kind = _DEV_TYPES[g.ggml_backend_dev_type(d)]
        backend = g.ggml_backend_dev_backend_reg(d)
        if kind == "GPU" and g.ggml_backend_reg_name(backend) != b"RPC":
            props = _DevProps()
            g.ggml_backend_dev_get_props(d, ctypes.byref(props))
            if props.device_id and props.device_id in seen_ids:
                continue  # one GPU seen by two backends (e.g. CUDA and Vulkan): llama.cpp keeps the first
            seen_ids.add(props.device_id or b"")
            gpus.append(d)
        elif kind == "IGPU" and (not igpus or backend == g.ggml_backend_dev_backend_reg(igpus[-1])):
            igpus.append(d)
    remote = [d for ep in (str(e) for e in rpc.parse_endpoints(rpc_servers)) for d in _rpc_devices.get(ep, [])]
    return remote + gpus + ([] if gpus else igpus)


def _devices_param(rpc_servers: Sequence[str]):
    """(value for llama_model_params.devices or None for llama.cpp's default, the device names used)."""
    g = _ggml()
    chosen = _offload_devices(rpc_servers)
    names = tuple(g.ggml_backend_dev_name(d).decode() for d in chosen)
    if not _rpc_devices:
        return None, names
    return (ctypes.c_void_p * (len(chosen) + 1))(*chosen, None), names




# -- where a loaded model runs ------------------------------------------------------------------------------------

def placement(n_gpu_layers: int, n_layer: int, offload_devices: Sequence[str]) -> dict:
    """Where a model's layers went, as llama.cpp counts them ("offloaded 31/31 layers to GPU": the blocks and
    the output layer): {"device": "cpu"} or {"device": "gpu", "layers": [on the devices, of all], "devices":
    ["Vulkan0"]}. A build without GPU offload, or --ngl 0, runs on the CPU whatever was asked."""
    if not n_gpu_layers or not offload_devices or not supports_gpu_offload():
        return {"device": "cpu"}
    total = n_layer + 1
    on = total if n_gpu_layers < 0 else min(n_gpu_layers, total)
    return {"device": "gpu", "layers": [on, total], "devices": list(offload_devices)}


def placement_text(p: dict) -> str:
    """"cpu", or "gpu 31/31 layers Vulkan0" (devices joined by '+' when layers are split over several)."""
    if p["device"] == "cpu":
        return "cpu"
    return f"gpu {p['layers'][0]}/{p['layers'][1]} layers {'+'.join(p['devices'])}"
