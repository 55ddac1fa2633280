"""Can this drafter draft for that target? llama.cpp's rule, read from GGUF metadata without loading weights.

Rule (common/speculative.cpp): same vocab type; same add-BOS/add-EOS flags and BOS/EOS ids; vocab sizes
within 128; identical token text for every id >= 5 up to the smaller vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def scalar(key: str):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8", "replace") if f.types[0].name == "STRING" else v.tolist()[0]

    f = r.fields.get("tokenizer.ggml.tokens")
    tokens = tuple(bytes(f.parts[i]) for i in f.data) if f else ()
    return VocabFacts(scalar("tokenizer.ggml.model") or "?", scalar("tokenizer.ggml.add_bos_token"),
                      scalar("tokenizer.ggml.add_eos_token"), scalar("tokenizer.ggml.bos_token_id"),
                      scalar("tokenizer.ggml.eos_token_id"), tokens)


def incompatibilities(target: VocabFacts, drafter: VocabFacts) -> list[str]:
    """Every failed rule, in words; empty when the pair is compatible."""
    why = []
    if target.model != drafter.model:
        why.append(f"vocab type differs: target {target.model}, drafter {drafter.model}")
    for what, a, b in (("add-BOS flag", target.add_bos, drafter.add_bos),
                       ("add-EOS flag", target.add_eos, drafter.add_eos),
                       ("BOS id", target.bos, drafter.bos), ("EOS id", target.eos, drafter.eos)):
        if a != b:
            why.append(f"{what} differs: target {a}, drafter {b}")
    nt, nd = len(target.tokens), len(drafter.tokens)
    if abs(nt - nd) > MAX_VOCAB_DIFF:
        why.append(f"vocab sizes differ by more than {MAX_VOCAB_DIFF}: target {nt}, drafter {nd}")
    for i in range(FIRST_CHECKED_ID, min(nt, nd)):
        if target.tokens[i] != drafter.tokens[i]:
            why.append(f"token {i} differs: target {target.tokens[i]!r}, drafter {drafter.tokens[i]!r}")
            break
    return why


def check_pair(target: str | Path, drafter: str | Path) -> list[str]:
    return incompatibilities(vocab_facts(target), vocab_facts(drafter))
