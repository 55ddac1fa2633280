"""How many multi-token-prediction (MTP, llama.cpp's "nextn") heads a GGUF carries, from its header alone.

A model with such heads drafts for itself (speculative/mtp.py): the loader makes that its default drafter, and
`models show` says how many there are.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from .gguf_header import read_header


def nextn_heads(path: str | Path) -> int:
    """The `<arch>.nextn_predict_layers` key (0 when absent, or when the file cannot be read: its load says why)."""
    try:
        kv = read_header(path, tokens=False).kv
    except ModelLoadError:
        return 0
    arch = kv.get("general.architecture", "")
    return int(kv.get(f"{arch}.nextn_predict_layers", 0) or 0)
