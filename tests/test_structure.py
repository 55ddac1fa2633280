"""The structure drafter: it drafts the text a grammar forces (a prefix chain of allowed tokens), never a token
the grammar forbids, nothing where the grammar leaves a choice, and the fallback drafter (lookup) otherwise.
Pure units over a synthetic finite-language grammar."""

from __future__ import annotations

import numpy as np

from localspec.sampling.constrain import Constraint
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.structure import STRUCTURE, StructureDrafter, forced_next, forced_tokens

VOCAB = [b"", b"{", b'{"', b'"', b"name", b'"name', b'":', b" ", b'"get', b"_weather", b'"}', b"}", b"a", b"b",
         b'"x', b'"y']
EOG = 0  # the empty piece stands for end of generation


def piece(t: int) -> bytes:
    return VOCAB[t]


class Language:
    """A grammar that accepts exactly `words` (bytes), over VOCAB; EOG allowed once a word is complete."""

    def __init__(self, words: list[bytes], done: bytes = b"") -> None:
        self.words, self.done = words, done

    def clone(self) -> "Language":
        return Language(self.words, self.done)

    def allows(self, token: int) -> bool:
        if token == EOG:
            return self.done in self.words
        nxt = self.done + VOCAB[token]
        return any(w.startswith(nxt) for w in self.words)

    def mask(self) -> np.ndarray:
        return np.array([self.allows(t) for t in range(len(VOCAB))])

    def accept(self, token: int) -> None:
        assert self.allows(token)
        self.done += VOCAB[token]

    def close(self) -> None:
        pass


CALL = b'{"name":"get_weather"}'


def test_forced_next_takes_the_longest_of_a_prefix_chain_else_the_common_prefix():
    mask = np.zeros(len(VOCAB), bool)
    mask[[3, 5]] = True  # '"' and '"name': a chain
    assert forced_next(mask, piece) == 5
    mask[8] = True  # '"get' diverges from '"name': only their common '"' is forced
    assert forced_next(mask, piece) == 3
    mask[3] = False  # and no token spells it alone: nothing is forced
    assert forced_next(mask, piece) is None
    assert forced_next(np.zeros(len(VOCAB), bool), piece) is None


def test_forced_tokens_spell_the_fixed_text_and_stop_at_a_choice():
    g = Language([CALL])
    toks = forced_tokens(g, 10, piece, is_eog=lambda t: t == EOG)
    assert b"".join(piece(t) for t in toks) == CALL  # the whole call is fixed; EOG is never drafted
    assert g.done == b""  # the walk ran on a clone
    two = Language([b'{"x"}', b'{"y"}'])
    assert b"".join(piece(t) for t in forced_tokens(two, 10, piece)) == b'{"'  # then x or y: a choice
    assert len(forced_tokens(Language([CALL]), 2, piece)) == 2  # never more than k


def test_drafts_are_always_allowed_by_the_grammar():
    rng = np.random.default_rng(0)
    words = [b'{"name":"get_weather"}', b'{"name":"ab"}', b'{"x"}', b"ab"]
    for _ in range(200):
        g = Language(words)
        path = b""
        while True:  # walk a random allowed path; at every point the forced draft must be allowed token by token
            toks = forced_tokens(g, 8, piece)
            check = g.clone()
            for t in toks:
                assert check.allows(t)
                check.accept(t)
            allowed = [t for t in np.flatnonzero(g.mask()) if t != EOG]
            if not allowed:
                break
            t = int(rng.choice(allowed))
            g.accept(t)
            path += piece(t)
        assert any(w.startswith(path) for w in words)


def test_drafter_uses_the_constraint_then_falls_back_to_lookup():
    d = StructureDrafter(piece, is_eog=lambda t: t == EOG, fallback=PromptLookup())
    assert d.sources[0] == STRUCTURE and STRUCTURE in d.prior and d.cost[STRUCTURE] == 0.0
    rng = np.random.default_rng(0)
    params = SamplingParams(constraint=Constraint(len(VOCAB), grammar=Language([CALL])))
    draft = d.propose([12, 13], lambda s: 4, params, rng)
    assert draft.source == STRUCTURE and draft.probs is None and len(draft) == 4
    assert d.propose([12, 13], lambda s: 0 if s == STRUCTURE else 4, params, rng).source != STRUCTURE
    plain = SamplingParams()  # no grammar: lookup's draft (a repeat of 12 13 12 13 ...)
    draft = d.propose([12, 13, 12, 13, 12], lambda s: 4, plain, rng)
    assert draft.source != STRUCTURE and len(draft) > 0
