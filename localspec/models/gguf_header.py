"""A GGUF header without the weights: key/values and tensor infos from a small streaming parser over an mmap.

Names and enums come from the `gguf` package, but not its reader: `gguf.GGUFReader` builds numpy arrays per
array element, which for Gemma's 262k-token vocabulary takes ~10 s and ~700 MB; this reads the same header in a
fraction of a second and touches no tensor data. Used by the drafter compatibility rule (compat.py), `models
show` (model_facts.py) and the loader's context check.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

# GGUF value types -> struct format (8 = string, 9 = array)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_KEEP_ARRAYS = ("tokenizer.ggml.tokens", "general.tags")


@dataclass(frozen=True)
class GGUFHeader:
    """Key/values (small arrays kept, big ones as their length) and tensor infos (name, shape, ggml type)."""

    path: Path
    version: int
    kv: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[tuple[str, tuple[int, ...], int], ...] = field(repr=False)


def read_header(path: str | Path, *, tokens: bool = True, keep: tuple[str, ...] = ()) -> GGUFHeader:
    """Parse a GGUF header; tensor data is never read. Raises ModelLoadError on a non-GGUF or damaged file.
    `keep`: further array keys to read in full (e.g. tokenizer.ggml.merges), beside the small ones always kept."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {p}")
    try:
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(p, mm, tokens, keep)
    except (struct.error, ValueError, UnicodeDecodeError, IndexError) as e:
        raise ModelLoadError(f"{p} is not a readable GGUF file ({e}); download it again") from None


def _parse(p: Path, mm: mmap.mmap, want_tokens: bool, extra: tuple[str, ...] = ()) -> GGUFHeader:
    if mm[:4] != b"GGUF":
        raise ValueError(f"magic {mm[:4]!r}, expected b'GGUF'")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    off = 24

    def string() -> str:
        nonlocal off
        (n,) = struct.unpack_from("<Q", mm, off)
        s = mm[off + 8: off + 8 + n]
        off += 8 + n
        return s.decode("utf-8", "replace")

    def value(t: int) -> Any:
        nonlocal off
        if t == 8:
            return string()
        fmt = "<" + _SCALAR[t]
        (v,) = struct.unpack_from(fmt, mm, off)
        off += struct.calcsize(fmt)
        return v

    kv: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", mm, off)
        off += 4
        if t != 9:
            kv[key] = value(t)
            continue
        et, n = struct.unpack_from("<IQ", mm, off)
        off += 12
        lengths[key] = n
        keep = key in extra or key in _KEEP_ARRAYS and (want_tokens or key != "tokenizer.ggml.tokens")
        if et == 8 and keep:
            kv[key], off = _read_strings(mm, off, n)
        elif et == 8:
            off = _skip_strings(mm, off, n)
        elif et == 9:
            raise ValueError(f"nested arrays in {key} are not supported")
        else:
            size = struct.calcsize("<" + _SCALAR[et])
            if keep:
                kv[key] = struct.unpack_from(f"<{n}{_SCALAR[et]}", mm, off)
            off += size * n
    tensors = []
    for _ in range(n_tensors):
        name = string()
        (nd,) = struct.unpack_from("<I", mm, off)
        dims = struct.unpack_from(f"<{nd}Q", mm, off + 4)
        (gt,) = struct.unpack_from("<I", mm, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 4 + 8
        tensors.append((name, tuple(dims), gt))
    return GGUFHeader(p, version, kv, lengths, tuple(tensors))


def _read_strings(mm: mmap.mmap, off: int, n: int) -> tuple[tuple[bytes, ...], int]:
    """n length-prefixed byte strings from `off`; returns them and the offset after the last."""
    unpack = struct.Struct("<Q").unpack_from
    out = []
    for _ in range(n):
        (ln,) = unpack(mm, off)
        out.append(mm[off + 8: off + 8 + ln])
        off += 8 + ln
    return tuple(out), off


def _skip_strings(mm: mmap.mmap, off: int, n: int) -> int:
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(n):
        off += 8 + unpack(mm, off)[0]
    return off
