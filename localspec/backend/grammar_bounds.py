"""What a GBNF grammar costs llama.cpp, measured in Python before llama.cpp sees it: the grammar is refused with a
`GrammarError` (a 400) that names the limit it passes.

Why a module: a request's grammar is text a client chose, and llama.cpp trusts it. Its parser recurses on groups
(a deep grammar overflows the stack), expands `{m,n}` into rules without checking m <= n (`"a"{5,1}` allocates
until the kernel's OOM killer ends the process), and its left-recursion check and its matcher follow every way
of matching nothing (a wide grammar runs for minutes on one token, and nothing can stop it from outside). The
limits follow src/llama-grammar.cpp's parse_sequence: MAX_REPEAT is its MAX_REPETITION_THRESHOLD, applied to
the rules a repetition generates as it does. The others are ours; docs/server.md#limits states them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import LocalspecError

MAX_BYTES = 1 << 20  # the grammar's text, read here on the request's way in: a JSON schema's is tens of KB
MAX_REPEAT = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD: a larger upper bound reads as none, a larger lower one fails
MAX_NESTING = 1000  # group depth: llama.cpp parses groups recursively (~0.5 KB of stack each; 20k overflowed 8 MB)
MAX_DEPTH = 4000  # rules deep along leftmost references: llama.cpp's left-recursion check recurses on them
MAX_PATHS = 1_000_000  # leftmost paths that check walks (it does not remember rules it has finished)
MAX_ELEMENTS = 2_000_000  # grammar elements once repetitions are expanded (8 bytes each in llama.cpp)
MAX_STACKS = 1024  # ways one position may continue without matching text: llama.cpp follows each, for each token
MAX_CODEPOINT = 0x10FFFF  # a character above it never occurs in text: a grammar that needs one can never finish


class GrammarError(LocalspecError):
    """A GBNF grammar or JSON schema that llama.cpp cannot use."""

    exit_code = 2


_TOKEN = re.compile(r"""
    (?P<skip>[ \t\r\n]+|\#[^\n]*)
  | (?P<lit>"(?:\\.|[^"\\])*")
  | (?P<cls>\[(?:\\.|[^\]\\])*\])
  | (?P<tok>!?<[^>\s]*>)
  | (?P<define>::=)
  | (?P<rep>\{\s*\d*\s*(?:,\s*\d*\s*)?\})
  | (?P<op>[()|*+?.])
  | (?P<name>[a-zA-Z0-9_-]+)
""", re.X | re.S)
_HEX_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")

# One element of an alternate: a rule's name (None: a terminal; "": an empty literal), and its repetition lo..hi
Item = tuple[str | None, int, int | None]
Rules = dict[str, list[list[Item]]]
Ref = tuple[str, int, int | None]  # a reference to a defined rule, repeated lo..hi times


def check_gbnf(gbnf: str) -> None:
    """Refuse a grammar that would overflow llama.cpp's stack, make its parser allocate without bound, or make its
    left-recursion check or its matcher run for ever: too deeply nested, an impossible or too large repetition,
    too long a chain of rules that may each match nothing, too many paths, or too many ways to go on from one
    position. A grammar this cannot read is refused too: llama.cpp would parse what comes before the fault."""
    size = len(gbnf.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise GrammarError(f"the grammar is {size} bytes long: at most {MAX_BYTES}")
    rules = _Reader().read(gbnf)
    depth: dict[str, int] = {}
    paths: dict[str, int] = {}
    stacks: dict[str, int] = {}
    nullable = _nullable(rules)
    for start in rules:
        _measure(start, rules, nullable, depth, paths, stacks)
    _check_stacks(rules, nullable, stacks)


@dataclass
class _Sequence:
    """The state llama.cpp's parse_sequence keeps for the sequence being read."""

    name: str
    alts: list[list[Item]]
    n_prev_rules: int = 1  # the rules the last symbol stands for (a group's, times its repetitions)
    last_size: int = 0  # the elements of the last symbol, which a repetition copies
    symbols_before: int = 0  # for a group: the symbols that existed when it opened


@dataclass
class _Reader:
    """Reads the rules, each a list of alternates; a group becomes a rule of its own, as llama.cpp makes it, and
    counts the symbols and elements llama.cpp's parser would make."""

    rules: Rules = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    generated: int = 0  # symbols llama.cpp generates: groups and the rules of repetitions
    elements: int = 0

    def read(self, gbnf: str) -> Rules:
        open_: list[_Sequence] = []  # the rule being read, then each open group
        tokens = _tokens(gbnf)
        for i, (kind, text) in enumerate(tokens):
            if kind == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "define":
                if len(open_) > 1:
                    raise GrammarError(f"llama.cpp could not parse the grammar: a rule inside a group ({text})")
                self.names.add(text)
                open_ = [_Sequence(text, self.rules.setdefault(text, []))]
                open_[0].alts.append([])
            elif kind == "define" or not open_:
                continue
            else:
                self._element(open_, kind, text)
        if self.elements > MAX_ELEMENTS:
            raise GrammarError(f"the grammar is too large for llama.cpp: {self.elements} elements once its "
                               f"repetitions are expanded (at most {MAX_ELEMENTS})")
        return self.rules

    def _element(self, open_: list[_Sequence], kind: str, text: str) -> None:
        seq = open_[-1]
        if kind == "op" and text == "(":
            if len(open_) > MAX_NESTING:
                raise GrammarError(f"the grammar nests groups more than {MAX_NESTING} deep")
            before = len(self.names) + self.generated
            self.generated += 1
            name = f" group{self.generated}"
            self.rules[name] = [[]]
            seq.alts[-1].append((name, 1, 1))
            open_.append(_Sequence(name, self.rules[name], symbols_before=before))
        elif kind == "op" and text == ")":
            if len(open_) < 2:
                raise GrammarError("llama.cpp could not parse the grammar: a ')' with no '('")
            group = open_.pop()
            parent = open_[-1]
            parent.n_prev_rules = max(1, len(self.names) + self.generated - group.symbols_before)
            parent.last_size = 1
            self.elements += 1
        elif kind == "op" and text == "|":
            seq.alts.append([])
            seq.n_prev_rules, seq.last_size = 1, 0
        elif kind == "rep" or (kind == "op" and text in "*+?"):
            if not seq.alts[-1]:
                raise GrammarError(f"llama.cpp could not parse the grammar: '{text}' after nothing")
            ref, _, _ = seq.alts[-1][-1]
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(text) or _bounds(text)
            self._repeat(seq, lo, hi)
            seq.alts[-1][-1] = (ref, lo, hi)
        else:
            if kind == "name":
                self.names.add(text)
                seq.alts[-1].append((text, 1, 1))
            else:  # a terminal: an empty literal matches nothing
                _check_chars(kind, text)
                seq.alts[-1].append(("" if text == '""' else None, 1, 1))
            seq.n_prev_rules, seq.last_size = 1, _size(kind, text)
            self.elements += seq.last_size

    def _repeat(self, seq: _Sequence, lo: int, hi: int | None) -> None:
        """What llama.cpp's handle_repetitions does to the last symbol: lo copies of it in the rule, then hi - lo
        rules (one when unbounded) that each hold one more copy."""
        if hi is not None and lo > hi:
            raise GrammarError(f"the grammar repeats a part {{{lo},{hi}}} times: the lower bound is above the upper")
        total = hi if hi else lo or 1
        if seq.n_prev_rules * total > MAX_REPEAT:
            raise GrammarError(f"the grammar repeats {seq.n_prev_rules} rules {total} times: at most {MAX_REPEAT} "
                               "in all (llama.cpp's MAX_REPETITION_THRESHOLD)")
        n_opt = 1 if hi is None else hi - lo
        self.generated += n_opt
        self.elements += seq.last_size * max(lo - 1, 0) + n_opt * (seq.last_size + 3)
        seq.n_prev_rules *= total
        seq.last_size = seq.last_size * lo + (1 if n_opt else 0)


def _tokens(gbnf: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    end = 0
    for m in _TOKEN.finditer(gbnf):
        if m.start() != end:
            break
        end = m.end()
        if m.lastgroup != "skip":
            tokens.append((m.lastgroup or "", m.group()))
    if end != len(gbnf):
        raise GrammarError(f"llama.cpp could not parse the grammar at character {end}: {gbnf[end:end + 20]!r}")
    return tokens


def _check_chars(kind: str, text: str) -> None:
    """A literal or a class may name no character above U+10FFFF: llama.cpp reads `\\U99999999` as one, and a
    grammar that must match it can never go on (the answer would break its own grammar)."""
    if kind not in ("lit", "cls"):
        return
    for m in _HEX_ESCAPE.finditer(text):
        if int(next(g for g in m.groups() if g), 16) > MAX_CODEPOINT:
            raise GrammarError(f"the grammar names the character {m.group()}, above U+10FFFF: no text holds it")


def _size(kind: str, text: str) -> int:
    """The elements llama.cpp makes for a terminal (at most; an escape is one character)."""
    return max(1, len(text) - 2) if kind in ("lit", "cls") else 1


def _bounds(rep: str) -> tuple[int, int | None]:
    parts = [p.strip() for p in rep[1:-1].split(",")]
    lo = int(parts[0] or 0)
    if lo > MAX_REPEAT:
        raise GrammarError(f"the grammar repeats a part at least {lo} times: at most {MAX_REPEAT} (llama.cpp's "
                           "MAX_REPETITION_THRESHOLD)")
    if len(parts) == 1:
        return lo, lo
    hi = int(parts[1]) if parts[1] else None
    return lo, None if hi is not None and hi > MAX_REPEAT else hi  # llama.cpp reads a larger bound as none


def _nullable(rules: Rules) -> set[str]:
    """The rules that may match the empty text (a fixpoint; unknown names match nothing)."""
    out: set[str] = {""}
    changed = True
    while changed:
        changed = False
        for name, alts in rules.items():
            if name not in out and any(all(r in out or lo == 0 for r, lo, _ in alt) for alt in alts):
                out.add(name)
                changed = True
    return out


def _measure(start: str, rules: Rules, nullable: set[str], depth: dict[str, int], paths: dict[str, int],
             stacks: dict[str, int]) -> None:
    """Depth and path count of llama.cpp's left-recursion walk from `start`, and the stacks its matcher makes
    where a rule starts, without recursing here."""
    if start in depth:
        return
    lefts: dict[str, list[Ref]] = {}
    stack, on_path = [start], {start}
    while stack:
        name = stack[-1]
        if name not in lefts:
            lefts[name] = _left_refs(name, rules, nullable)
        left = lefts[name]
        while left and left[-1][0] in depth:  # measured: drop from the end, so each is looked at once
            left.pop()
        todo = left[-1][0] if left else None
        if todo in on_path:
            raise GrammarError("the grammar is left-recursive (a rule can come back to itself before matching text)")
        if todo is not None:
            stack.append(todo)
            on_path.add(todo)
            continue
        left = _left_refs(name, rules, nullable)
        d, p = 1, 1
        for r, lo, hi in left:  # r{lo,hi} is lo copies of r, then a chain of hi - lo rules: S ::= r S' |
            empty = r in nullable
            copies = lo if empty else min(lo, 1)  # the copies llama.cpp's check reaches
            p += copies * paths[r]
            d = max(d, 1 + depth[r]) if copies else d
            n = (1 if hi is None else hi - lo) if lo == 0 or empty else 0
            if n and empty:
                d, p = max(d, 1 + n + depth[r]), p + n * (1 + paths[r])
            elif n:
                d, p = max(d, 2 + depth[r]), p + 1 + paths[r]
        if d > MAX_DEPTH or p > MAX_PATHS:
            raise GrammarError(f"the grammar is too deep for llama.cpp: {d} rules deep along leftmost references "
                               f"(at most {MAX_DEPTH}), {p} paths through them (at most {MAX_PATHS})")
        depth[name], paths[name] = d, p
        stacks[name] = min(sum(next(iter(_runs(alt, nullable, stacks)), 0) for alt in rules.get(name, [])),
                           MAX_STACKS + 1)
        _refuse_wide(name, stacks[name])
        stack.pop()
        on_path.discard(name)


def _runs(alt: list[Item], nullable: set[str], stacks: dict[str, int]) -> list[int]:
    """The stacks llama.cpp's matcher makes from each position of an alternate: the item's own, and the next
    item's too where this one may match nothing (an item repeated lo..hi times counts once per copy it may skip
    to). `stacks` holds the rules referenced where it matters (the leftmost walk measured them first)."""
    out = [0] * (len(alt) + 1)
    for i in range(len(alt) - 1, -1, -1):
        r, lo, hi = alt[i]
        own = 1 if r is None else 0 if r == "" else stacks.get(r, 1)
        empty = r == "" or r in nullable
        copies = lo + (1 if hi is None else hi - lo) if empty else 0 if hi == 0 else 1
        out[i] = min(own * copies + (out[i + 1] if empty or lo == 0 else 0), MAX_STACKS + 1)
    return out[:-1]


def _check_stacks(rules: Rules, nullable: set[str], stacks: dict[str, int]) -> None:
    """Every position inside every alternate, not only where rules start, against MAX_STACKS."""
    for name, alts in rules.items():
        for alt in alts:
            _refuse_wide(name, max(_runs(alt, nullable, stacks), default=0))


def _refuse_wide(name: str, n: int) -> None:
    if n > MAX_STACKS:
        where = "a group" if name.startswith(" ") else f"rule {name}"
        raise GrammarError(f"the grammar is too wide for llama.cpp: {where} may go on in more than {MAX_STACKS} "
                           "ways without matching text (alternatives, or parts that may match nothing, in a row), "
                           "and llama.cpp follows each for every token")


def _left_refs(name: str, rules: Rules, nullable: set[str]) -> list[Ref]:
    return [(r, lo, hi) for r, lo, hi in _leftmost(rules.get(name, []), nullable) if r is not None and r in rules]


def _leftmost(alts: list[list[Item]], nullable: set[str]) -> list[Item]:
    """The references llama.cpp's check follows: in each alternate, up to the first that must match text."""
    out: list[Item] = []
    for alt in alts:
        for r, lo, hi in alt:
            if r:
                out.append((r, lo, hi))
            if not (lo == 0 or r in nullable):
                break
    return out
