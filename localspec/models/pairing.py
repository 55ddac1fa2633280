"""Drafter/target compatibility from GGUF headers alone: llama.cpp's rule, every failing part in words.

Rule (common/speculative.cpp): same vocab type; same add-BOS/add-EOS flags and BOS/EOS ids; vocab sizes
within 128; identical token text for every id >= 5 up to the smaller vocab. `incompatibilities` reports every
rule that fails, not just the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .gguf_header import read_header

MAX_VOCAB_DIFF = 128
FIRST_CHECKED_ID = 5


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
