"""GGUF facts without loading weights: drafter/target compatibility (llama.cpp's rule) and `models show`.

Rule (common/speculative.cpp): same vocab type; same add-BOS/add-EOS flags and BOS/EOS ids; vocab sizes
within 128; identical token text for every id >= 5 up to the smaller vocab. `incompatibilities` reports every
rule that fails, not just the first.

The header is read with a small streaming parser over an mmap (names and enums from the `gguf` package):
`gguf.GGUFReader` builds numpy arrays per array element, which for Gemma's 262k-token vocabulary takes ~10 s
and ~700 MB; this reads the same header in a fraction of a second and touches no tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadError

MAX_VOCAB_DIFF = 128
FIRST_CHECKED_ID = 5

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


def read_header(path: str | Path, *, tokens: bool = True) -> GGUFHeader:
    """Parse a GGUF header; tensor data is never read. Raises ModelLoadError on a non-GGUF or damaged file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {p}")
    try:
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(p, mm, tokens)
    except (struct.error, ValueError, UnicodeDecodeError, IndexError) as e:
        raise ModelLoadError(f"{p} is not a readable GGUF file ({e}); download it again") from None


def _parse(p: Path, mm: mmap.mmap, want_tokens: bool) -> GGUFHeader:
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
        keep = key in _KEEP_ARRAYS and (want_tokens or key != "tokenizer.ggml.tokens")
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


# -- compatibility ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VocabFacts:
    model: str
    add_bos: bool | None
    add_eos: bool | None
    bos: int | None
    eos: int | None
    tokens: tuple[bytes, ...]


def vocab_facts(path: str | Path) -> VocabFacts:
    kv = read_header(path).kv
    g = kv.get
    return VocabFacts(g("tokenizer.ggml.model") or "?", g("tokenizer.ggml.add_bos_token"),
                      g("tokenizer.ggml.add_eos_token"), g("tokenizer.ggml.bos_token_id"),
                      g("tokenizer.ggml.eos_token_id"), g("tokenizer.ggml.tokens", ()))


# llama.cpp's add-BOS/add-EOS defaults per vocab type, used when the GGUF does not set the flag
_DEFAULT_ADD = {"llama": (True, False), "bert": (True, False), "t5": (False, True)}


def _flags(v: VocabFacts) -> tuple[bool, bool]:
    bos, eos = _DEFAULT_ADD.get(v.model, (False, False))
    return (bos if v.add_bos is None else bool(v.add_bos)), (eos if v.add_eos is None else bool(v.add_eos))


def incompatibilities(target: VocabFacts, drafter: VocabFacts) -> list[str]:
    """Every failed rule, in words; empty when the pair is compatible."""
    why = []
    if target.model != drafter.model:
        why.append(f"vocab type differs: target {target.model}, drafter {drafter.model}")
    (tb, te), (db, de) = _flags(target), _flags(drafter)
    for what, a, b in (("add-BOS flag", tb, db), ("add-EOS flag", te, de),
                       ("BOS id", target.bos, drafter.bos), ("EOS id", target.eos, drafter.eos)):
        if a != b:
            why.append(f"{what} differs: target {a}, drafter {b}")
    nt, nd = len(target.tokens), len(drafter.tokens)
    if abs(nt - nd) > MAX_VOCAB_DIFF:
        why.append(f"vocab sizes differ by more than {MAX_VOCAB_DIFF}: target {nt}, drafter {nd}")
    differ = [i for i in range(FIRST_CHECKED_ID, min(nt, nd)) if target.tokens[i] != drafter.tokens[i]]
    if differ:
        i = differ[0]
        why.append(f"token text differs at {len(differ)} of {min(nt, nd) - FIRST_CHECKED_ID} ids >= "
                   f"{FIRST_CHECKED_ID}, first at id {i}: target {target.tokens[i]!r}, drafter {drafter.tokens[i]!r}")
    return why


def check_pair(target: str | Path, drafter: str | Path) -> list[str]:
    return incompatibilities(vocab_facts(target), vocab_facts(drafter))


# -- `models show` ----------------------------------------------------------------------------------------------

_SPECIAL = ("bos", "eos", "eot", "eom", "unknown", "padding", "sep", "mask",
            "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")


def _file_type_name(v: int | None) -> str | None:
    import gguf

    try:
        return gguf.LlamaFileType(v).name.removeprefix("MOSTLY_") if v is not None else None
    except ValueError:
        return str(v)


def _dominant_tensor_type(tensors) -> str | None:
    import gguf

    counts: dict[int, int] = {}
    for _, dims, t in tensors:
        n = 1
        for d in dims:
            n *= d
        counts[t] = counts.get(t, 0) + n
    if not counts:
        return None
    t = max(counts, key=counts.get)
    try:
        return gguf.GGMLQuantizationType(t).name
    except ValueError:
        return str(t)


def describe(path: str | Path) -> dict[str, Any]:
    """What `localspec models show` prints: facts from the header, as plain data (JSON-ready)."""
    h = read_header(path)
    kv = h.kv
    arch = kv.get("general.architecture", "?")
    tokens = kv.get("tokenizer.ggml.tokens", ())
    params = 0
    for _, dims, _t in h.tensors:
        n = 1
        for d in dims:
            n *= d
        params += n
    special = {}
    for s in _SPECIAL:
        tid = kv.get(f"tokenizer.ggml.{s}_token_id")
        if tid is not None:
            text = tokens[tid].decode("utf-8", "replace") if 0 <= tid < len(tokens) else "?"
            special[s] = {"id": tid, "text": text}
    return {
        "path": str(h.path), "size_bytes": h.path.stat().st_size, "gguf_version": h.version,
        "name": kv.get("general.name"), "arch": arch, "size_label": kv.get("general.size_label"),
        "params": params, "n_tensors": len(h.tensors), "n_layers": kv.get(f"{arch}.block_count"),
        "quant": _file_type_name(kv.get("general.file_type")) or _dominant_tensor_type(h.tensors),
        "context_length": kv.get(f"{arch}.context_length"), "embedding_length": kv.get(f"{arch}.embedding_length"),
        "vocab_type": kv.get("tokenizer.ggml.model"), "vocab_pre": kv.get("tokenizer.ggml.pre"),
        "n_vocab": h.array_lengths.get("tokenizer.ggml.tokens", 0),
        "add_bos": kv.get("tokenizer.ggml.add_bos_token"), "add_eos": kv.get("tokenizer.ggml.add_eos_token"),
        "special_tokens": special, "fim": all(f"fim_{x}" in special for x in ("pre", "suf", "mid")),
        "chat_template": "tokenizer.chat_template" in kv,
    }


def quick_facts(path: str | Path) -> dict[str, Any]:
    """Arch, quant and size for `models list` (skips the vocabulary)."""
    h = read_header(path, tokens=False)
    return {"arch": h.kv.get("general.architecture", "?"), "size_bytes": h.path.stat().st_size,
            "quant": _file_type_name(h.kv.get("general.file_type")) or _dominant_tensor_type(h.tensors)}
