"""What a fast-path verdict (fastpath.py) is kept under (verdicts.py): the model's layout (architecture, every
tensor's name, type and shape: two files of one model share it), CPU, cores, thread counts and llama.cpp build, so a
warm start reads one small file instead of running a trial.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import llama_cpp

from ..models.gguf_header import read_header
from ..models.paths import calibration_dir
from .ggml import build_info
from .machine import cpu_count, cpu_model
from .verdicts import write_json

SCHEMA = 2  # 2: verdicts compare logits with the reference path and are keyed by tensor shapes


def _layout(path: Path) -> dict:
    """The file's weight types, and a digest of its architecture and every tensor's name, type and shape: what
    decides which kernels a decode runs. Remembered per file (path, size, mtime): parsing a header with a
    262k-token vocabulary takes 20-40 ms, which a warm start should not pay."""
    st = path.stat()
    file_id = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    index = calibration_dir() / "layouts.json"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(file_id), dict):
        return known[file_id]
    layout = _header_layout(path)
    others = [(k, v) for k, v in (known.items() if isinstance(known, dict) else ())
              if k.rsplit(":", 2)[0] != str(path.resolve())]  # an older copy of this file is gone
    write_json(index, dict(others[-255:] + [(file_id, layout)]))
    return layout


def _header_layout(path: Path) -> dict:
    import gguf

    header = read_header(path, tokens=False)
    types, tensors = set(), []
    for name, dims, t in header.tensors:
        try:
            type_name = gguf.GGMLQuantizationType(t).name
        except ValueError:
            type_name = str(t)
        tensors.append([name, type_name, list(dims)])
        if len(dims) >= 2:
            types.add(type_name)
    arch = header.kv.get("general.architecture", "")
    digest = hashlib.sha256(json.dumps([arch, sorted(tensors)]).encode()).hexdigest()[:20]
    return {"types": sorted(types), "tensors": digest}


def _library_id() -> dict:
    """The llama.cpp library file itself: a rebuild with other flags is another build."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    files = sorted(lib.glob("libllama*")) + sorted(lib.glob("libggml-cpu*"))
    return {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.is_file()}


def cache_key(path: Path, counts: Sequence[int]) -> dict:
    """What a verdict holds for: the model's layout, the CPU, its cores, the thread counts tried, the build."""
    return {"schema": SCHEMA, **_layout(path), "cpu": cpu_model(), "cores": cpu_count(),
            "counts": list(counts), "build": build_info(), "library": _library_id()}
