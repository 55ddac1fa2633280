"""What `localspec models show` gathers beside the header's facts (the CPU fast paths, the memory kind, the
devices) and how it prints them: `name: value` lines."""

from __future__ import annotations


def print_facts(d: dict) -> None:
    from ..models.catalog import human_size

    rows = [
        ("model", d["model"]), ("file", d["path"]), ("size", human_size(d["size_bytes"])),
        ("name", d["name"] or "-"), ("arch", d["arch"]),
        ("params", f"{d['params'] / 1e6:.1f} M" + (f" ({d['size_label']})" if d["size_label"] else "")),
        ("layers", d["n_layers"]), ("quant", d["quant"] or "-"), ("context", d["context_length"]),
        ("vocab", f"{d['n_vocab']} ({d['vocab_type']}, pre {d['vocab_pre'] or '-'})"),
        ("add bos/eos", f"{d['add_bos']}/{d['add_eos']}"),
        ("special", ", ".join(f"{k}={v['id']} {v['text']!r}" for k, v in d["special_tokens"].items()) or "-"),
        ("fim", "yes" if d["fim"] else "no"), ("chat template", "yes" if d["chat_template"] else "no"),
        ("verify on CPU", _verify_kind(d["row_by_row"])), ("memory", d["memory_text"]),
        ("mtp heads", d["mtp_text"]),
        ("cpu fast paths", d["fast_path_text"]), ("system", d["system_info"]),
    ]
    _echo_facts(rows)


def _echo_facts(rows: list[tuple[str, object]]) -> None:
    """'name: value' lines, the names aligned right (a header-less rich table)."""
    from ..bench import tables

    t = tables.facts()
    for k, v in rows:
        tables.add(t, f"{k}:", v)
    tables.echo(t)


def cpu_paths(path) -> dict:
    """Which of llama.cpp's extra CPU buffer types this model loads with here (a test load in a child process
    the first time, backend/fastpath.py), and llama.cpp's system info line (the CPU features the build uses)."""
    from ..backend import fastpath, system_info

    fp = fastpath.choose(path)
    return {"fast_path": fp.to_dict(), "fast_path_text": fp.describe(), "system_info": system_info().strip()}


def memory(path) -> dict:
    """The memory kind (attention, recurrent, hybrid) and how a rejected draft is rewound (backend/rollback.py)."""
    from ..backend import memory_facts

    m = memory_facts(path)
    return {"memory": {"kind": m.kind, "rollback": m.method, "rs_depth": m.rs_depth,
                       "timings_ms": {k: list(v) for k, v in m.timings_ms.items()}},
            "memory_text": m.describe()}


def mtp(path) -> dict:
    """How many multi-token-prediction heads the file carries: they draft for it unless a drafter is named."""
    from ..models.nextn import nextn_heads

    n = nextn_heads(path)
    return {"mtp_heads": n, "mtp_text": f"{n} (the default drafter: --draft mtp)" if n else "none"}


def _verify_kind(slow: dict[str, float]) -> str:
    """How llama.cpp's CPU backend multiplies a verify batch by these weights (model_facts.ROW_BY_ROW)."""
    if not slow:
        return "batched"
    return "row by row: " + ", ".join(f"{t} ({100 * x:.0f} % of weights)" for t, x in slow.items())


def device_info(rpc: str | None = None) -> dict:
    """What llama.cpp can offload to; `rpc` servers are probed and registered first (one line if one is down)."""
    from .. import backend

    endpoints = [x.strip() for x in (rpc or "").split(",") if x.strip()]
    if endpoints:
        backend.add_rpc_servers(endpoints)
    return {"gpu_offload": backend.supports_gpu_offload(), "rpc": backend.supports_rpc(),
            "devices": backend.devices(), "system_info": backend.system_info().strip()}


def print_device(d: dict) -> None:
    from ..models.catalog import human_size

    rows: list[tuple[str, object]] = [
        ("gpu offload", "yes" if d["gpu_offload"] else "no (CPU-only build; see docs/models.md)"),
        ("rpc", "yes" if d["rpc"] else "no (build with -DGGML_RPC=on)")]
    for dev in d["devices"]:
        where = f"rpc server {dev['description']}" if dev["backend"] == "RPC" else dev["description"]
        memory_text = f"{human_size(dev['free'])} free of {human_size(dev['total'])}"
        rows.append(("device", f"{dev['name']} - {where} ({memory_text})"))
    _echo_facts([*rows, ("system", d["system_info"])])
