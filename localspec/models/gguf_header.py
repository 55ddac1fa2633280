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
    at = _Cursor(mm, 24)
    kv: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = at.string()
        (t,) = at.unpack("<I")
        if t != 9:
            kv[key] = at.value(t)
            continue
        keep = key in extra or key in _KEEP_ARRAYS and (want_tokens or key != "tokenizer.ggml.tokens")
        lengths[key] = _array(at, key, kv if keep else None)
    return GGUFHeader(p, version, kv, lengths, tuple(_tensor_info(at) for _ in range(n_tensors)))


class _Cursor:
    """A read position in the header: GGUF is packed little-endian, so each read returns a value and moves on."""

    __slots__ = ("mm", "off")

    def __init__(self, mm: mmap.mmap, off: int) -> None:
        self.mm, self.off = mm, off

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        out = struct.unpack_from(fmt, self.mm, self.off)
        self.off += struct.calcsize(fmt)
        return out

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        s = self.mm[self.off: self.off + n]
        self.off += n
        return s.decode("utf-8", "replace")

    def value(self, t: int) -> Any:
        return self.string() if t == 8 else self.unpack("<" + _SCALAR[t])[0]


def _array(at: _Cursor, key: str, into: dict[str, Any] | None) -> int:
    """Read one array value into `into` under `key` (None: skip it); returns its length. A string array is kept
    as a tuple of bytes, read by whoever needs it (most callers want a few entries of a 262k-token vocabulary)."""
    et, n = at.unpack("<IQ")
    if et == 8 and into is not None:
        into[key], at.off = _read_strings(at.mm, at.off, n)
    elif et == 8:
        at.off = _skip_strings(at.mm, at.off, n)
    elif et == 9:
        raise ValueError(f"nested arrays in {key} are not supported")
    else:
        if into is not None:
            into[key] = struct.unpack_from(f"<{n}{_SCALAR[et]}", at.mm, at.off)
        at.off += struct.calcsize("<" + _SCALAR[et]) * n
    return n


def _tensor_info(at: _Cursor) -> tuple[str, tuple[int, ...], int]:
    """One tensor info: name, dimensions, ggml type (its data offset is skipped: no tensor data is read)."""
    name = at.string()
    (nd,) = at.unpack("<I")
    dims = at.unpack(f"<{nd}Q")
    (gt,) = at.unpack("<I")
    at.off += 8
    return name, tuple(dims), gt


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
