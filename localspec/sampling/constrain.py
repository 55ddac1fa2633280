"""Per-request constraints on the next-token distribution: `logit_bias` and a grammar (structured output).

A constraint is a logits transform applied before the warp, to the target's verify rows (p) and to the model
drafter's rows (q) alike. Speculative sampling emits exactly the warped p whatever p and q are (verify.py), so
with both constrained the output is exactly the constrained target distribution: speculation stays on and
stays lossless. Prompt-lookup drafts are point masses that ignore the constraint; a draft the grammar forbids
has p = 0 at its position and is rejected there.

Grammar state: row i of a verify pass scores the position after context + drafts[:i], so it is masked by the
grammar's state after those tokens. A `Constraint` follows the accepted context by itself (tokens appended
since it last looked are accepted into its state, as the model drafter follows the context by common prefix),
so the loop only ever asks for rows. States along the current draft path are cached until the context moves:
the drafter's q rows and the target's p rows share them. One `Constraint` serves one generation.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..backend import Model
    from .params import SamplingParams


class GrammarState(Protocol):
    """What a grammar offers (backend.Grammar over llama.cpp; tests use synthetic ones)."""

    def clone(self) -> "GrammarState": ...

    def mask(self) -> np.ndarray: ...  # bool [V]: allowed next

    def allows(self, token: int) -> bool: ...

    def accept(self, token: int) -> None: ...  # only for allowed tokens

    def close(self) -> None: ...


class ConstraintBroken(RuntimeError):
    """The accepted context contains a token the grammar forbids: a bug in whoever built the context."""


Path = tuple[int, ...]


class Constraint:
    """logit_bias (added to every row; -inf bans a token) and an optional grammar, for one generation."""

    def __init__(self, n_vocab: int, *, bias: Mapping[int, float] | None = None,
                 grammar: GrammarState | None = None, tokenize: Callable[[str], list[int]] | None = None,
                 literals: Sequence[str] = ()) -> None:
        self.n_vocab = n_vocab
        # the model's tokenizer (text -> ids, no BOS): the structure drafter spells the forced text with it, and
        # the grammar's string literals (keys, enum values, punctuation): the tokens it asks the grammar about
        self.tokenize = tokenize
        self.literals = tuple(literals)
        self.bias: np.ndarray | None = None
        if bias:
            self.bias = np.zeros(n_vocab, dtype=np.float32)
            for t, b in bias.items():
                self.bias[t] += b
        self.grammar = grammar
        self._n = -1  # context length the grammar state has followed (-1: not started)
        self._start = -1  # the context length at the first call (the prompt)
        self._path: dict[Path, GrammarState | None] = {}  # draft prefix -> state after it (None: forbidden)
        self._masks: dict[Path, np.ndarray] = {}  # draft prefix -> allowed next tokens (computed when needed)

    # -- the calls the loop and the drafter make --

    def rows(self, logits: np.ndarray, context: Sequence[int], drafts: Sequence[int], *,
             greedy: bool = False) -> np.ndarray:
        """logits [n, V], row i scoring the position after context + drafts[:i] -> constrained copy.
        `greedy`: only the argmax of each row will be read, so only it is kept (no full-vocabulary mask)."""
        self._follow(context)
        return np.stack([self._row(logits[i], tuple(drafts[:i]), greedy) for i in range(len(logits))])

    def row(self, logits: np.ndarray, context: Sequence[int], prefix: Sequence[int], *,
            greedy: bool = False) -> np.ndarray:
        """One row [V] scoring the position after context + prefix (a drafter's next token)."""
        self._follow(context)
        return self._row(logits, tuple(prefix), greedy)

    def state(self, context: Sequence[int]) -> GrammarState | None:
        """The grammar's state after `context` (the structure drafter's start; clone before accepting), or None
        without a grammar."""
        if self.grammar is None:
            return None
        self._follow(context)
        return self._state(())

    @property
    def start(self) -> int:
        """The context length generation started at (the prompt's; -1 before the first call): where the
        generated text the structure drafter reads begins."""
        return self._start

    def close(self) -> None:
        self._drop_path(keep=None)
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None

    # -- internals --

    def _row(self, logits: np.ndarray, prefix: Path, greedy: bool) -> np.ndarray:
        out = np.array(logits, dtype=np.float32, copy=True)
        if self.bias is not None:
            out += self.bias
        g = self._state(prefix) if self.grammar is not None else None
        if g is not None:  # None: no grammar, or the path left the grammar earlier (the row is never read)
            if greedy and np.isfinite(out).any():
                best = _best_allowed(g, out)
                if best is not None:
                    kept = np.full_like(out, -np.inf)
                    kept[best] = out[best]
                    return kept
            out[~self._mask(prefix, g)] = -np.inf
        if not np.isfinite(out).any():  # everything banned: fall back to the grammar alone, else the raw row
            out = np.array(logits, dtype=np.float32, copy=True)
            if g is not None and self._mask(prefix, g).any():
                out[~self._mask(prefix, g)] = -np.inf
        return out

    def _mask(self, prefix: Path, g: GrammarState) -> np.ndarray:
        m = self._masks.get(prefix)
        if m is None:
            m = self._masks[prefix] = g.mask()
        return m

    def _state(self, prefix: Path) -> GrammarState | None:
        """The grammar state after context + prefix; None once the prefix leaves the grammar."""
        if prefix in self._path:
            return self._path[prefix]
        assert self.grammar is not None
        if not prefix:
            g: GrammarState | None = self.grammar
        else:
            parent = self._state(prefix[:-1])
            g = None
            if parent is not None and parent.allows(prefix[-1]):
                g = parent.clone()
                g.accept(prefix[-1])
        self._path[prefix] = g
        return g

    def _follow(self, context: Sequence[int]) -> None:
        """Accept what the context gained since the last call (the first call fixes where generation starts)."""
        if self.grammar is None:
            return
        if self._n < 0:
            self._n = self._start = len(context)
            return
        if len(context) < self._n:
            raise ConstraintBroken(f"context shrank from {self._n} to {len(context)} tokens: one Constraint "
                                   "serves one generation")
        new = tuple(context[self._n:])
        if not new:
            return
        cached = [p for p in self._path if p and new[:len(p)] == p and self._path[p] is not None]
        start = max(cached, key=len, default=())
        g = self._path[start] if start else self.grammar
        assert g is not None
        self._drop_path(keep=g)
        if g is not self.grammar:
            self.grammar.close()
            self.grammar = g
        for t in new[len(start):]:
            if not g.allows(t):
                if not g.mask().any():  # the grammar's fault, not the loop's: nothing could have come next
                    from ..backend.grammar_bounds import GrammarError

                    raise GrammarError("the grammar allows no token here and is not complete: it can never "
                                       "be finished (a character no text holds, or a class that matches none)")
                raise ConstraintBroken(f"token {t} at position {self._n} is not allowed by the grammar")
            g.accept(t)
        self._n = len(context)

    def _drop_path(self, keep: GrammarState | None) -> None:
        for g in self._path.values():
            if g is not None and g is not keep and g is not self.grammar:
                g.close()
        self._path.clear()
        self._masks.clear()


_PROBE = 64  # greedy: the best allowed token is almost always among the row's top few


def _best_allowed(g: GrammarState, row: np.ndarray) -> int | None:
    """The highest-scoring token the grammar allows, checking candidates one by one from the top (cheap
    single-token checks instead of a full-vocabulary mask); None when none of the top `_PROBE` is allowed."""
    n = min(_PROBE, len(row))
    top = np.argpartition(-row, n - 1)[:n]
    for t in top[np.argsort(-row[top], kind="stable")]:
        if not np.isfinite(row[t]):
            return None
        if g.allows(int(t)):
            return int(t)
    return None


def constrain_rows(params: "SamplingParams", logits: np.ndarray, context: Sequence[int],
                   drafts: Sequence[int]) -> np.ndarray:
    """The verify pass's call: `params.constraint`'s rows, or `logits` untouched when there is none."""
    c = params.constraint
    return logits if c is None else c.rows(logits, context, drafts, greedy=params.greedy)


def constrain_row(params: "SamplingParams", logits: np.ndarray, context: Sequence[int],
                  prefix: Sequence[int]) -> np.ndarray:
    """The model drafter's call for its next token after context + prefix."""
    c = params.constraint
    return logits if c is None else c.row(logits, context, prefix, greedy=params.greedy)


def build_constraint(model: "Model", *, logit_bias: Mapping[int, float] | None = None,
                     grammar: str | None = None) -> Constraint | None:
    """A request's constraint over `model`'s vocabulary (GBNF text for `grammar`), or None when it asks for none.
    Raises backend.GrammarError (a 400 for the server) when llama.cpp cannot parse the grammar."""
    if not logit_bias and not grammar:
        return None
    from ..backend import Grammar

    bad = [t for t in (logit_bias or {}) if not 0 <= t < model.n_vocab]
    if bad:
        raise ValueError(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {model.n_vocab})")
    return Constraint(model.n_vocab, bias=logit_bias, grammar=Grammar(model, grammar) if grammar else None,
                      tokenize=lambda text: model.tokenize(text, add_special=False),
                      literals=gbnf_literals(grammar) if grammar else ())


_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
_CLASS = re.compile(r"\[(?:[^\]\\]|\\.)*\]")  # a character class ([^"\\]) holds quotes that open no literal


def gbnf_literals(gbnf: str) -> list[str]:
    """The quoted string literals of a GBNF grammar, unescaped (`"\\"name\\""` -> `"name"`), in order, once each."""
    out: dict[str, None] = {}
    for m in _LITERAL.finditer(_CLASS.sub(" ", gbnf)):
        try:
            text = json.loads(f'"{m.group(1)}"')
        except ValueError:  # an escape JSON does not have (GBNF's \x..): the literal as written
            text = m.group(1)
        if text:
            out[text] = None
    return list(out)
