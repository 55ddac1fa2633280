"""Speculation on the structure: draft the text a request's grammar (or JSON schema, as GBNF) forces.

A tool call's or a schema's JSON is mostly fixed text: keys in order, punctuation, const values, and an enum
value (a tool's name) once its first characters make it the only one left. Where the grammar leaves the next
text no choice, the target writes it whatever it samples, so a draft of it is accepted, if the draft spells it
in the tokens the target would pick.

The forced text is found on the grammar, then spelled by the target's tokenizer:
- the walk (`forced_text`): at each grammar state, when the allowed-next set is a prefix chain (one token's
  bytes extend every other's: `"`, `"lo`, `"location`), its longest token's bytes are forced, unless a shorter
  one may be followed by a space (`_before_space`); otherwise the set's common prefix, when a token spells it;
  an allowed set that diverges (a free string, a choice between keys or values) ends the walk;
- layout: llama.cpp's JSON-schema grammars allow optional whitespace between tokens (`space`), which would end
  every walk at the next separator. Where the only choice is whitespace before forced text and the answer so
  far has twice put the same whitespace after the same character, the walk takes that (`guess_layout`) and
  walks on; otherwise it stops there, and the target's own token (the round's bonus) makes the choice;
- spelling (`spell`): the grammar's greedy longest tokens (`{"name`) are not how the model writes the text
  (`{"` `name`), so the forced bytes are tokenized by the target's own tokenizer (`Constraint.tokenize`), in the
  context of the token before them, and every drafted token is checked against the grammar.
Cost: a full-vocabulary mask costs about a target step on a small model (far more on Gemma's 262,144 tokens),
so the walk asks the grammar about candidate tokens one by one (`among`: the grammar's literals as the model
spells them, digits, letters); it does not run inside free text (`_free`), and the forced text ahead is kept
between rounds, so a segment the target accepts over several rounds is walked once
(docs/bench/structure.md#structure-drafting).

Rules this keeps:
- the draft is a function of the context and the grammar only, never of the sampling draws, so the same-seed
  verify rule applies: one seed, one text, with it on or off (docs/design.md "The verify rule");
- every drafted token is one the grammar allows after the drafts before it: it never proposes forbidden text;
- it may propose fewer tokens than allowed (nothing forced: an empty draft, or the fallback drafter's).
`StructureDrafter` composes with prompt lookup: structure first where the grammar forces text, the fallback
(lookup) otherwise, its draft cut where the grammar forbids it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np

from ..sampling.constrain import Constraint, GrammarState
from ..sampling.params import SamplingParams
from .types import EMPTY, Draft, Drafter, KFor

STRUCTURE = "structure"  # the source name of drafts the grammar forces
# forced text is written whatever the target samples, up to its tokenization: a high prior on every position
STRUCTURE_PRIOR = (0.9, 0.9)
_MAX_CHAIN = 64  # forced_next: an allowed set larger than this is a free choice (a string's contents)
_MAX_SET = 4096  # the walk: the same, counting the whitespace tokens a layout choice allows
_MAX_BYTES = 256  # forced text walked ahead at most
_HISTORY = 4096  # bytes of the answer so far the layout guess reads (the prompt's layout is not the model's)
WHITESPACE = b" \t\n\r"
_WS_BYTES = tuple(WHITESPACE[i:i + 1] for i in range(len(WHITESPACE)))
_PROBE_TEXT = ('{"', '"}', '":', '",', "[{", "}]", "{", "}", "[", "]", ",", ":", '"', " ", "\n", "0123456789",
               "aeiost", "true", "false", "null")  # with a grammar's literals: the walk's candidate tokens
_SEPARATORS = (b"{", b"[", b",", b":", b"}", b"]")  # where JSON's layout is a habit the answer repeats

Piece = Callable[[int], bytes]
Tokenize = Callable[[str], list[int]]


def forced_tokens(state: GrammarState, k: int, piece: Piece, *, is_eog: Callable[[int], bool] = lambda t: False
                  ) -> tuple[int, ...]:
    """Up to k tokens the grammar forces from `state` (not changed: the walk runs on a clone), as the grammar's
    longest tokens. Stops at the first position whose allowed set is not a prefix chain, or whose forced token
    ends generation. The spelling without a tokenizer (`spell` is the one with)."""
    out: list[int] = []
    g = state.clone()
    try:
        while len(out) < k:
            t = forced_next(g.mask(), piece)
            if t is None or is_eog(t):
                break
            out.append(t)
            g.accept(t)
    finally:
        g.close()
    return tuple(out)


def forced_next(mask: np.ndarray, piece: Piece) -> int | None:
    """The token an allowed-next mask forces (`forced_piece`), or None (nothing allowed, or more than
    `_MAX_CHAIN` allowed: a free choice)."""
    ids = np.flatnonzero(mask)
    if len(ids) == 0 or len(ids) > _MAX_CHAIN:
        return None
    return forced_piece({int(t): piece(int(t)) for t in ids})


def forced_piece(pieces: Mapping[int, bytes]) -> int | None:
    """The token whose bytes are forced by an allowed set: in a prefix chain, the longest (every other token's
    bytes begin it: `"`, `"lo`, `"location`); otherwise the token that spells the set's longest common prefix
    (`"` before a free string: `"`, `"Par`, `"Lon`). None when nothing is common or no token spells it."""
    if not pieces:
        return None
    best = max(pieces, key=lambda t: (len(pieces[t]), -t))
    longest = pieces[best]
    if longest and all(longest.startswith(p) for p in pieces.values()):
        return best
    common = _common_prefix(list(pieces.values()))
    if not common:
        return None
    return next((t for t in sorted(pieces) if pieces[t] == common), None)


def _common_prefix(items: list[bytes]) -> bytes:
    lo, hi = min(items), max(items)  # the common prefix of all is that of the smallest and largest
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    return lo[:n]


def guess_layout(text: bytes) -> bytes | None:
    """The whitespace the target will write after `text`'s last byte, when the answer so far says so: the two
    latest earlier occurrences of that byte were followed by the same whitespace (`": "`, `",\\n  "`). None
    when it has not (a first occurrence, or two that differ: a small model is not consistent, `{ "a": [{"b"`):
    the walk stops there and the target's own next token makes the choice. A function of the text only."""
    if not text or text[-1:] not in _SEPARATORS:
        return None  # after a quote: a key's or a value's end, or a string's start, each laid out its own way
    last, seen = text[-1:], list[bytes]()
    end = len(text) - 1
    while len(seen) < 2:
        i = text.rfind(last, 0, end)
        if i < 0:
            return None
        j = i + 1
        while j < len(text) and text[j:j + 1] in _WS_BYTES:
            j += 1
        seen.append(text[i + 1:j])
        end = i
    return seen[0] if seen[0] == seen[1] else None


def _layout_token(pieces: Mapping[int, bytes], ws: bytes | None) -> int | None:
    """At a choice that is only whitespace before forced text, the token that writes `ws` (then as much of the
    forced text as one token holds); None when the choice is more than layout, `ws` is unknown (None) or no
    token writes it."""
    if ws is None:
        return None
    spaced = {t: p for t, p in pieces.items() if p[:1] in _WS_BYTES}
    other = {t: p for t, p in pieces.items() if p[:1] not in _WS_BYTES}
    forced = forced_piece(other)
    if not spaced or forced is None:
        return None
    text = other[forced]
    if not all(text.startswith(p.lstrip(WHITESPACE)) for p in spaced.values()):
        return None  # a whitespace token followed by something the forced text does not start with
    if not ws:
        return forced
    fits = [t for t, p in spaced.items() if p.startswith(ws) and p[len(ws):len(ws) + 1] not in _WS_BYTES]
    return max(fits, key=lambda t: (len(spaced[t]), -t)) if fits else None



def _before_space(g: GrammarState, pieces: Mapping[int, bytes], t: int, spaces: Sequence[int]) -> int:
    """A prefix chain's longest token `t`, or its shortest member after which the grammar allows whitespace:
    `{` and `{"` chain, yet `{ "` is allowed too (optional space; the vocabulary has no `{ ` token), so only
    `{` is forced and the space is a layout choice. A few single-token checks, not a mask."""
    shorter = [m for m in pieces if m != t and len(pieces[m]) < len(pieces[t]) and pieces[m].strip(WHITESPACE)]
    for m in sorted(shorter, key=lambda m: len(pieces[m])):  # a whitespace member: the layout already chosen
        h = g.clone()
        try:
            h.accept(m)
            if any(h.allows(sp) for sp in spaces):
                return m
        finally:
            h.close()
    return t


def full_mask(g: GrammarState) -> np.ndarray:
    """Every token the grammar allows next: one pass over the vocabulary (about a target step on a small model)."""
    return np.flatnonzero(g.mask())


def among(candidates: Sequence[int]) -> Callable[[GrammarState], np.ndarray]:
    """The allowed tokens among `candidates` only, by single-token checks: the grammar's literals in the model's
    tokens, their characters, JSON's punctuation, digits and letters (`StructureDrafter._candidates`). A free
    position still shows as one (several letters or digits allowed); far cheaper than a mask of a large
    vocabulary (Gemma's 262,144 tokens)."""
    return lambda g: np.array([t for t in candidates if g.allows(t)], dtype=np.int64)


def forced_text(state: GrammarState, piece: Piece, *, is_eog: Callable[[int], bool] = lambda t: False,
                history: bytes = b"", max_bytes: int = _MAX_BYTES, spaces: Sequence[int] = (),
                allowed: Callable[[GrammarState], np.ndarray] = full_mask) -> bytes:
    """The bytes the grammar forces from `state` (walked on a clone), whitespace choices guessed from
    `history` + the walk (`guess_layout`). `spaces`: whitespace tokens (` `, `\\n`), to find the optional
    whitespace a chain hides (`_before_space`). Stops where the grammar may end or offers a real choice; never
    ends in guessed whitespace (the target may well merge it with the free text that follows)."""
    out = bytearray()
    keep = 0  # bytes of `out` that are not trailing guessed whitespace
    g = state.clone()
    try:
        while len(out) < max_bytes:
            ids = allowed(g)
            if len(ids) == 0 or len(ids) > _MAX_SET:
                break
            pieces = {int(t): piece(int(t)) for t in ids}
            if any(is_eog(t) or not p for t, p in pieces.items()):
                break  # the grammar may end here: a choice
            t = forced_piece(pieces)
            if t is None:
                t = _layout_token(pieces, guess_layout(history + bytes(out)))
            if t is None:
                break
            if spaces and pieces[t].strip(WHITESPACE):
                t = _before_space(g, pieces, t, spaces)
            out += pieces[t]
            g.accept(t)
            if pieces[t].strip(WHITESPACE):
                keep = len(out)
    finally:
        g.close()
    return bytes(out[:keep])


def _text(data: bytes) -> str:
    """The longest valid UTF-8 prefix of `data`, decoded (a forced piece may end inside a character)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return data[:e.start].decode("utf-8")


def spell(forced: bytes, tokenize: Tokenize, piece: Piece, before: int | None = None) -> list[int]:
    """`forced` in the target's own tokens, as it would write them after the token `before`: the text is
    tokenized with that token's bytes in front (a merge across the boundary is then seen), and the tokens for
    those bytes dropped; where they do not split off cleanly the text is tokenized alone."""
    text = _text(forced)
    if not text:
        return []
    head = piece(before) if before is not None else b""
    if head and _text(head).encode("utf-8") == head:
        toks = tokenize(head.decode("utf-8") + text)
        n, have = 0, b""
        while n < len(toks) and len(have) < len(head):
            have += piece(toks[n])
            n += 1
        if have == head:
            return toks[n:]
    return tokenize(text)


def allowed_prefix(state: GrammarState, tokens: Sequence[int], is_eog: Callable[[int], bool]) -> list[int]:
    """The longest prefix of `tokens` the grammar allows from `state` (checked on a clone), stopping before an
    end-of-generation token: a draft is never longer than what the target could write."""
    out: list[int] = []
    g = state.clone()
    try:
        for t in tokens:
            if is_eog(t) or not g.allows(t):
                break
            out.append(t)
            g.accept(t)
    finally:
        g.close()
    return out


class StructureDrafter:
    """Drafts what the request's grammar forces (`params.constraint`'s grammar); otherwise asks `fallback`
    (prompt lookup), when there is one, and cuts its draft where the grammar forbids it. A request without a
    grammar drafts from the fallback only."""

    name: str = STRUCTURE

    def __init__(self, piece: Piece, *, is_eog: Callable[[int], bool] = lambda t: False,
                 fallback: Drafter | None = None) -> None:
        self.piece, self.is_eog, self.fallback = piece, is_eog, fallback
        extra = fallback.sources if fallback else ()
        self.sources: tuple[str, ...] = (STRUCTURE, *extra)
        # declared free: a walk's masks cost about a step on a small model, once per forced segment; the adaptive
        # controller learns the real c from each round's drafting time
        self.cost: Mapping[str, float | None] = {STRUCTURE: 0.0, **(fallback.cost if fallback else {})}
        self.prior: Mapping[str, tuple[float, ...]] = {STRUCTURE: STRUCTURE_PRIOR,
                                                      **(fallback.prior if fallback else {})}
        self._pieces: dict[int, bytes] = {}
        self._ahead: tuple[Constraint, bytes] | None = None  # (its request, generated text + forced text)
        self._space_ids: tuple[int, ...] | None = None
        self._probes: tuple[tuple[int, int], ...] | None = None  # letter and digit pairs (`_free`)
        self._cands: tuple[Constraint, tuple[int, ...]] | None = None  # (its request, `_candidates`)

    def _piece(self, t: int) -> bytes:
        p = self._pieces.get(t)
        if p is None:
            p = self._pieces[t] = self.piece(t)
        return p

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        c = params.constraint
        state = c.state(context) if c is not None else None
        if c is not None and state is not None:
            k = k_for(STRUCTURE)
            if k > 0:
                tokens = self._structure(c, state, context, k)
                if tokens:
                    return Draft(tuple(tokens), None, STRUCTURE)
        if self.fallback is None:
            return EMPTY
        draft = self.fallback.propose(context, k_for, params, rng)
        if state is None or draft.probs is not None or not draft.tokens:
            return draft  # a model drafter's draft is constrained already (constrain_row)
        kept = allowed_prefix(state, draft.tokens, self.is_eog)
        return replace(draft, tokens=tuple(kept)) if kept else EMPTY

    def _structure(self, c: Constraint, state: GrammarState, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens of forced text after `context`: spelled by the target's tokenizer when the constraint
        has one, the grammar's longest tokens otherwise."""
        if c.tokenize is None:
            return list(forced_tokens(state, k, self._piece, is_eog=self.is_eog))
        forced = self._forced(c, state, context)
        if not forced:
            return []
        tokens = spell(forced, c.tokenize, self._piece, context[-1] if context else None)
        return allowed_prefix(state, tokens[:k], self.is_eog)

    def _forced(self, c: Constraint, state: GrammarState, context: Sequence[int]) -> bytes:
        """The forced text ahead of the generated text: the rest of the last walk while the answer is still
        on it, nothing inside free text (`_free`), else a new walk."""
        done = b"".join(self._piece(t) for t in context[max(c.start, 0):])
        if self._ahead is not None and self._ahead[0] is c:
            ahead = self._ahead[1]
            if len(ahead) > len(done) and ahead.startswith(done):
                return ahead[len(done):]
        if self._free(c, state):
            return b""
        cands = self._candidates(c)
        forced = forced_text(state, self._piece, is_eog=self.is_eog, history=done[-_HISTORY:],
                             spaces=self._spaces(c), allowed=among(cands) if cands else full_mask)
        self._ahead = (c, done + forced) if forced else None
        return forced

    def _free(self, c: Constraint, state: GrammarState) -> bool:
        """Inside free text (a string's or a number's contents) nothing is forced: two different letters, or
        two different digits, are allowed next. A few single-token checks instead of the walk's first mask,
        which costs as much as a target step on a small model (docs/bench/structure.md#structure-drafting)."""
        if self._probes is None and c.tokenize is not None:
            pairs = [[c.tokenize(a) for a in pair] for pair in (("a", "e"), ("1", "2"))]
            self._probes = tuple((x[0], y[0]) for x, y in pairs if len(x) == len(y) == 1)
        return any(state.allows(x) and state.allows(y) for x, y in self._probes or ())

    def _candidates(self, c: Constraint) -> tuple[int, ...]:
        """The tokens the walk asks the grammar about, for this request's grammar (found once per request): its
        literals as the model spells them and their characters, JSON's punctuation, whitespace, digits, and a
        few letters (so free text shows as a choice). Empty without literals: the walk masks instead."""
        if self._cands is not None and self._cands[0] is c:
            return self._cands[1]
        ids: dict[int, None] = {}
        if c.tokenize is not None and c.literals:
            texts = list(c.literals) + list(_PROBE_TEXT)
            for text in texts + sorted({ch for lit in texts for ch in lit}):
                ids.update(dict.fromkeys(c.tokenize(text)))
        self._cands = (c, tuple(ids))
        return self._cands[1]

    def _spaces(self, c: Constraint) -> tuple[int, ...]:
        """The target's tokens for one space and one newline (its tokenizer's spelling), found once."""
        if self._space_ids is None and c.tokenize is not None:
            ids = [c.tokenize(w) for w in (" ", "\n")]
            self._space_ids = tuple(t[0] for t in ids if len(t) == 1)
        return self._space_ids or ()

    def close(self) -> None:
        self._ahead = self._cands = None
        if self.fallback is not None:
            self.fallback.close()
