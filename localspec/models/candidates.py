"""Which local GGUFs could draft for a target: the same tokenizer, compared by content, never by name.

A file's tokenizer is fingerprinted from its GGUF header alone: a hash of the vocabulary (token texts), one of
the BPE merges, and the special tokens llama.cpp's pairing rule reads (vocab type, BOS/EOS ids, add-BOS/EOS
flags). Fingerprints are cached by (path, size, mtime), so scanning a hub cache of large models reads each
header once. Two files with equal fingerprints tokenize alike; when only the vocabulary hashes differ and the
sizes are within llama.cpp's tolerance, its own rule (pairing.py) decides.

The places searched: models.toml entries on disk, every GGUF in the Hugging Face hub cache, the `--models-dir`
folders (and LOCALSPEC_MODELS_DIR), and the self drafters `localspec models make-drafter` wrote. Models.toml
entries not on disk cannot be fingerprinted; `registry_offers` names those the registry vouches for (a pair's
drafter, or the target's family by hub name), for `models drafters` and `models pull --drafter-for`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from ..errors import LocalspecError
from .gguf_header import read_header
from .pairing import MAX_VOCAB_DIFF, check_pair
from .paths import cache_dir

MODELS_DIR_ENV = "LOCALSPEC_MODELS_DIR"  # os.pathsep-separated folders of GGUFs to search for drafters
_MERGES = "tokenizer.ggml.merges"


@dataclass(frozen=True)
class TokenizerPrint:
    """A tokenizer as content: equal prints tokenize every text to the same ids."""

    vocab_type: str
    n_tokens: int
    tokens: str  # sha256 of the token texts, in id order
    merges: str  # sha256 of the merges ("" when the vocabulary has none)
    specials: tuple  # (bos id, eos id, add-BOS, add-EOS)

    @property
    def digest(self) -> str:
        text = json.dumps([self.vocab_type, self.tokens, self.merges, list(self.specials)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _hash(items: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for x in items:
        h.update(len(x).to_bytes(4, "little"))
        h.update(x)
    return h.hexdigest()


def _compute(path: Path) -> TokenizerPrint:
    kv = read_header(path, keep=(_MERGES,)).kv
    tokens = kv.get("tokenizer.ggml.tokens", ())
    merges = kv.get(_MERGES, ())
    specials = (kv.get("tokenizer.ggml.bos_token_id"), kv.get("tokenizer.ggml.eos_token_id"),
                kv.get("tokenizer.ggml.add_bos_token"), kv.get("tokenizer.ggml.add_eos_token"))
    return TokenizerPrint(kv.get("tokenizer.ggml.model") or "?", len(tokens), _hash(tokens),
                          _hash(merges) if merges else "", specials)


def _cache_file() -> Path:
    return cache_dir() / "tokenizers.json"


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def tokenizer_print(path: str | Path) -> TokenizerPrint:
    """The file's tokenizer fingerprint, from the cache when the file is unchanged (ModelLoadError if unreadable)."""
    p = Path(path).expanduser()
    key = _file_key(p)
    try:
        cache = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        d = cache[key]
        return TokenizerPrint(d["vocab_type"], d["n_tokens"], d["tokens"], d["merges"], tuple(d["specials"]))
    tp = _compute(p)
    cache[key] = asdict(tp)
    try:
        _cache_file().parent.mkdir(parents=True, exist_ok=True)
        tmp = _cache_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(_cache_file())
    except OSError:
        pass  # a read-only cache only costs the next search its header reads
    return tp


def mismatch(target: Path, drafter: Path) -> list[str]:
    """Why `drafter` does not tokenize as `target` does, in words; empty when it does (it may draft)."""
    t, d = tokenizer_print(target), tokenizer_print(drafter)
    if t.digest == d.digest:
        return []
    if t.tokens != d.tokens and (t.vocab_type != d.vocab_type or abs(t.n_tokens - d.n_tokens) > MAX_VOCAB_DIFF):
        return [f"different vocabulary: target {t.vocab_type} with {t.n_tokens} tokens, "
                f"drafter {d.vocab_type} with {d.n_tokens}"]
    why = check_pair(target, drafter) if (t.tokens != d.tokens or t.specials != d.specials) else []
    if t.merges != d.merges:
        why.append("same tokens but different BPE merges (it would split text differently)")
    return why


@dataclass(frozen=True)
class LocalFile:
    name: str  # the registry name, else the file name
    path: Path
    origin: str  # "models.toml", "hub cache", "models dir", "self drafter"


def _gguf_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.gguf") if p.is_file() and "mmproj" not in p.name.lower())


def models_dirs(extra: Iterable[str | Path] = ()) -> list[Path]:
    """The --models-dir folders, then those in LOCALSPEC_MODELS_DIR."""
    env = [x for x in os.environ.get(MODELS_DIR_ENV, "").split(os.pathsep) if x]
    return [Path(x).expanduser() for x in [*extra, *env]]


def self_drafter_dir() -> Path:
    """Where `make-drafter` writes a low-bit copy when the target's own folder cannot take it."""
    return cache_dir() / "drafters"


SELF_QUANTS = ("Q4_0", "Q4_1", "Q8_0")  # the low-bit copies make-drafter writes; the first is its default


def self_drafter_path(target: str | Path, quant: str = SELF_QUANTS[0]) -> Path:
    """Where the target's low-bit copy lives: beside the target when that folder is writable and not the hub
    cache (whose snapshots the hub client owns), else in localspec's cache under a name tied to the file."""
    from . import hub

    t = Path(target).expanduser()
    name = f"{t.stem}.self-{quant}.gguf"
    folder = t.parent
    in_hub = Path(hub.cache_dir()).resolve() in t.resolve().parents or Path(hub.cache_dir()).resolve() in t.parents
    if not in_hub and os.access(folder, os.W_OK):
        return folder / name
    tag = hashlib.sha256(_file_key(t).encode()).hexdigest()[:8]
    return self_drafter_dir() / f"{t.stem}-{tag}.self-{quant}.gguf"


def self_drafters(target: str | Path) -> list[Path]:
    """The low-bit copies of the target that exist, in SELF_QUANTS order."""
    return [p for q in SELF_QUANTS if (p := self_drafter_path(target, q)).is_file()]


def same_shapes(a: str | Path, b: str | Path) -> bool:
    """The two files hold the same tensors (names and shapes): one is a requantized copy of the other."""
    ta, tb = read_header(a, tokens=False).tensors, read_header(b, tokens=False).tensors
    return sorted((n, s) for n, s, _ in ta) == sorted((n, s) for n, s, _ in tb)


def local_files(dirs: Iterable[str | Path] = (), target: str | Path | None = None) -> list[LocalFile]:
    """Every GGUF this machine has where localspec looks: models.toml, the hub cache, folders, self drafters."""
    from . import hub
    from .registry import load_registry
    from .resolve import entry_path

    found: list[LocalFile] = []
    for name, e in load_registry().models.items():
        try:
            found.append(LocalFile(name, entry_path(e, fetch=False), "models.toml"))
        except LocalspecError:
            continue  # not on disk
    hub_root = Path(hub.cache_dir())
    for p in _gguf_files(hub_root):
        found.append(LocalFile(p.name, p, "hub cache"))
    for d in models_dirs(dirs):
        found += [LocalFile(p.name, p, "models dir") for p in _gguf_files(d)]
    own = self_drafters(target) if target is not None else []
    found = [LocalFile(p.name, p, "self drafter") for p in own] + found
    found += [LocalFile(p.name, p, "self drafter") for p in _gguf_files(self_drafter_dir())]
    seen: set[Path] = set()
    out = []
    for f in found:
        real = f.path.resolve()
        if real not in seen:
            seen.add(real)
            out.append(f)
    return out


@dataclass(frozen=True)
class Match:
    """A local file checked against a target: `reasons` empty means it may draft for it."""

    file: LocalFile
    size_bytes: int
    reasons: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.reasons


def matches(target: str | Path, dirs: Iterable[str | Path] = ()) -> list[Match]:
    """Every local file but the target itself, with why it cannot draft for the target (empty: it can)."""
    t = Path(target).expanduser()
    real = t.resolve()
    out = []
    for f in local_files(dirs, t):
        if f.path.resolve() == real:
            continue
        try:
            reasons = tuple(mismatch(t, f.path))
        except LocalspecError as e:  # a damaged or partial file in a cache: say so, never fail the search
            reasons = (str(e),)
        out.append(Match(f, f.path.stat().st_size, reasons))
    return out


# -- registry models not downloaded yet -------------------------------------------------------------------------

_SIZE_TEXT = re.compile(r"\(~?(\d+(?:\.\d+)?)\s*(KB|MB|GB|TB)\b", re.I)
_UNITS = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
_FAMILY_DROP = re.compile(r"(?i)(?<![a-z0-9])(\d+(\.\d+)?[bm]|gguf|instruct|it|chat|base|fim|(?:iq|q)\d[a-z0-9_]*"
                          r"|bf16|f16|f32)(?![a-z0-9])")


@dataclass(frozen=True)
class RegistryOffer:
    """A models.toml model that is not on disk but should draft for the target ('localspec models pull NAME')."""

    name: str
    size_bytes: int | None  # from its description ("(~0.5 GB)"), else unknown until pulled
    paired: bool  # a models.toml pair names it as the drafter of a model with the target's tokenizer
    why: str  # which entry vouches for its tokenizer; the pull checks it against the file


def size_from_text(text: str) -> int | None:
    """'... Q8_0 (~0.5 GB): drafter' -> 500000000: the size a models.toml description states, if it does."""
    m = _SIZE_TEXT.search(text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()]) if m else None


def family(name: str) -> str:
    """'Qwen/Qwen2.5-Coder-7B-Instruct-GGUF' or 'qwen2.5-coder-0.5b-instruct-q8_0.gguf' -> 'qwen2.5-coder': a hub
    repo or file name without its owner, size, quant and variant tags. Models of one family share a tokenizer as
    a rule, whoever uploaded them (a guess: the pull checks the file)."""
    stem = name.lower().rsplit("/", 1)[-1].removesuffix(".gguf")
    return re.sub(r"[-_.]{2,}", "-", _FAMILY_DROP.sub("", stem)).strip("-_.")


def _kin(target: Path, on_disk: dict[str, Path]) -> list[str]:
    """Registry names whose file on disk is the target or tokenizes as it does."""
    real = target.resolve()
    out = []
    for name, path in on_disk.items():
        try:
            if path.resolve() == real or not mismatch(target, path):
                out.append(name)
        except LocalspecError:
            continue  # a damaged file vouches for nothing
    return out


def registry_offers(target: str | Path) -> list[RegistryOffer]:
    """models.toml entries not on disk that should draft for the target: those a pair names as the drafter of a
    registry model with the target's tokenizer, then those of the same hub family. Never touches the network."""
    from .registry import load_registry
    from .resolve import entry_path

    reg = load_registry()
    on_disk: dict[str, Path] = {}
    for name, e in reg.models.items():
        try:
            on_disk[name] = entry_path(e, fetch=False)
        except LocalspecError:
            continue
    t = Path(target).expanduser()
    kin = _kin(t, on_disk)
    offers: dict[str, RegistryOffer] = {}
    for p in reg.pairs.values():
        if p.target in kin and p.drafter in reg.models and p.drafter not in on_disk:
            e = reg.models[p.drafter]
            offers.setdefault(p.drafter, RegistryOffer(p.drafter, size_from_text(e.description), True,
                                                       f"models.toml pairs it with {p.target}"))
    families = {family(t.name): t.name}
    for k in kin:
        families.setdefault(family(on_disk[k].name), k)
        families.setdefault(family(reg.models[k].hf or on_disk[k].name), k)
    families.pop("", None)
    for name, e in reg.models.items():
        if name in offers or name in on_disk or not e.hf or family(e.hf) not in families:
            continue
        size = size_from_text(e.description)
        if size is not None and size >= t.stat().st_size:
            continue  # a bigger model of the family is a target, not a drafter
        offers[name] = RegistryOffer(name, size, False,
                                     f"same family as {families[family(e.hf)]} ({family(e.hf)}; unchecked)")
    return list(offers.values())


# -- the target's own low-bit copy, before make-drafter writes it ------------------------------------------------

_COPY_BITS = {"Q4_0": 4.5, "Q4_1": 5.0, "Q8_0": 8.5}  # bits per weight of a matrix at that type (block scales in)
_EMBD_BITS = 8.5  # llama.cpp's quantizer keeps the output/embedding matrix at Q6_K or Q8_0: about this


def self_copy_bytes(target: str | Path, quant: str = SELF_QUANTS[0]) -> int:
    """About the size `make-drafter` would write: each matrix at `quant` (the output or tied embedding matrix at
    ~8.5 bits, as llama.cpp's quantizer keeps it), the rest as the target stores it. Read from the header."""
    import gguf

    total = 0
    for name, dims, gt in read_header(target, tokens=False).tensors:
        n = 1
        for d in dims:
            n *= d
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(gt)]
        now = n // block * size
        if len(dims) >= 2 and dims[0] % 32 == 0:
            bits = _EMBD_BITS if name in ("output.weight", "token_embd.weight") else _COPY_BITS[quant]
            total += min(now, int(n * bits / 8))
        else:
            total += now
    return total
