"""Copies at another indentation: code moved into a class or a block, nested JSON, nested lists.

Prompt lookup copies tokens verbatim, so a copy whose lines sit deeper (or shallower) than the original breaks
at every line: the indentation token differs (`"\\n   "` against `"\\n       "`), the match ends, and the draft
fails at the next line start. Here the context is also indexed *flat*: every indentation token (a newline and a
run of spaces, or a run of spaces: one token in byte-level BPE vocabularies like SmolLM2's) stands for its
newline count alone, so a match runs across lines whatever their depth. The draft is the original's
continuation with each indentation moved by the shift seen in the match (the context's latest indentation
against the original's at the same place). llama.cpp's n-gram drafters have no such thing.

Which tokens are indentation, and which token is a given indentation, comes from the target's vocabulary,
learnt as tokens are met (a scan of a 262k vocabulary costs a second at load).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from ..backend import Model

Width = tuple[int, int]  # (newlines, spaces) of an indentation token
_INDENT = re.compile(rb"(\n*)( +)")
FLAT_BASE = -2  # flat token of an indentation with n newlines: FLAT_BASE - n (below suffix.SEPARATOR, -1)


class Indents:
    """The vocabulary's indentation tokens: `width(token)` and `token(width)`, cached."""

    def __init__(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self._piece, self._tokenize = piece, tokenize
        self._width: dict[int, Width | None] = {}
        self._token: dict[Width, int | None] = {}

    @classmethod
    def of(cls, model: Model) -> Indents:
        return cls(model.piece, lambda s: model.tokenize(s, add_special=False))

    def width(self, token: int) -> Width | None:
        if token not in self._width:
            m = _INDENT.fullmatch(self._piece(token)) if token >= 0 else None
            self._width[token] = (len(m[1]), len(m[2])) if m else None
        return self._width[token]

    def token(self, width: Width) -> int | None:
        """The one token that is this indentation, or None (the vocabulary spells it in several)."""
        if width not in self._token:
            toks = self._tokenize("\n" * width[0] + " " * width[1]) if width[1] > 0 else []
            self._token[width] = toks[0] if len(toks) == 1 and self.width(toks[0]) == width else None
        return self._token[width]

    def flat(self, token: int) -> int:
        """The token as the flat index sees it: an indentation is its newline count, anything else itself."""
        w = self.width(token)
        return token if w is None else FLAT_BASE - w[0]

    def shift(self, tokens: Sequence[int], end: int, length: int) -> int | None:
        """Spaces to add to the original's indentation: the latest place in the match (the `length` tokens
        before `tokens`' end against those before `end`) where the two indentations differ. None: they
        never differ there, so the flat match is no reindented copy."""
        n = len(tokens)
        for j in range(1, length + 1):
            a, b = tokens[n - j], tokens[end - j]
            if a != b:
                wa, wb = self.width(a), self.width(b)
                if wa is not None and wb is not None:
                    return wa[1] - wb[1]
        return None

    def moved(self, tokens: Sequence[int], shift: int) -> list[int]:
        """`tokens` with every indentation moved by `shift` spaces, cut where the vocabulary has no single
        token for the moved one (or it would have no spaces left)."""
        out: list[int] = []
        for t in tokens:
            w = self.width(t)
            if w is not None:
                moved = self.token((w[0], w[1] + shift)) if w[1] + shift > 0 else None
                if moved is None:
                    break
                t = moved
            out.append(t)
        return out
