"""Grammars over a model's vocabulary: llama.cpp's GBNF engine and JSON-schema converter, for constrained decoding.

Why a module: constrain.py (the constraint logic, pure numpy) needs only "which tokens may come next" and "the
state after this token"; this is that interface over llama.cpp's grammar sampler, kept here because it is
llama_cpp code. Parse errors become `GrammarError` (exit 2 on the command line, a 400 from the server).

No grammar may take the process down or hold it: grammar_bounds.check_gbnf measures in Python what a grammar
would cost llama.cpp (stack depth, memory, the ways its matcher follows) before llama.cpp sees it.
A schema's bounds (`maxLength: 524288`) become llama.cpp's `{m,n}` repetitions, as llama-server's C++ converter
writes them, instead of the Python port's nested optionals (one group per character).
"""

from __future__ import annotations

import ctypes
import json
import re._parser as sre  # type: ignore[import-not-found]  # Python's regex parser: what a pattern's parts match
from typing import TYPE_CHECKING, Any

import llama_cpp
import llama_cpp.llama_grammar as port
import numpy as np

from ..crash import suspected
from .grammar_bounds import MAX_DEPTH, MAX_NESTING, MAX_REPEAT, GrammarError, check_gbnf

__all__ = ["Grammar", "GrammarError", "json_schema_grammar", "check_gbnf", "MAX_DEPTH", "MAX_NESTING", "MAX_REPEAT"]

if TYPE_CHECKING:
    from .model import Model

_CHUNK = 1000  # a lower bound above MAX_REPEAT is written as (item{1000}){q} item{r,}
# Schema keywords the converter builds a grammar from; a schema with none of them only annotates: any value
_SHAPING = {"type", "$ref", "oneOf", "anyOf", "allOf", "const", "enum", "properties", "additionalProperties",
            "items", "prefixItems", "pattern", "format"}


def json_schema_grammar(schema: dict) -> str:
    """A JSON schema -> GBNF, with llama-cpp-python's port of llama.cpp's json-schema-to-grammar, bounds as
    `{m,n}` and annotation-only subschemas (`{"description": ...}`, `true`) as any value, as llama-server has them."""
    try:
        schema = json.loads(json.dumps(schema))  # a copy: resolve_refs rewrites "$ref"
        conv = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        conv.visit(conv.resolve_refs(schema, "stdin"), "")
        return conv.format_grammar()
    except GrammarError:
        raise
    except Exception as e:  # the converter raises whatever it trips on (KeyError, ValueError, TypeError, ...)
        raise GrammarError(f"cannot use this JSON schema: {type(e).__name__}: {e}") from None


class _Converter(port.SchemaConverter):
    def visit(self, schema: Any, name: str) -> str:
        if schema is True or (isinstance(schema, dict) and not schema.keys() & _SHAPING):
            rule = name + "-" if name in port.RESERVED_NAMES else name or "root"
            return self._add_rule(rule, self._add_primitive("value", port.PRIMITIVE_RULES["value"]))
        if not isinstance(schema, dict):
            raise GrammarError(f"cannot use this JSON schema: a schema must be an object or true, got {schema!r}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and repeats_an_empty_match(pattern):
            raise GrammarError(f"cannot use this JSON schema: the pattern {pattern[:80]!r} repeats a part that can "
                               "match nothing (as in (a?)* or (a?){0,9}); write the part so it matches something")
        return super().visit(schema, name)


def repeats_an_empty_match(pattern: str) -> bool:
    """True when a quantifier allowing more than one repeat applies to a part that can match nothing, as in
    `(a?)*` or `((a?){0,19}){0,19}`. llama.cpp's grammar engine follows every way of matching nothing at each
    step, and such a grammar held the generation thread for minutes at its first token (a fuzzed schema)."""
    try:
        return _empty_repeat(sre.parse(pattern))
    except Exception:  # a pattern Python cannot read: the converter says what it cannot use
        return False


def _empty_repeat(sub: Any) -> bool:
    for op, av in sub:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            _, hi, item = av
            if (hi > 1 and item.getwidth()[0] == 0) or _empty_repeat(item):
                return True
        elif op in (sre.SUBPATTERN, sre.ATOMIC_GROUP):
            if _empty_repeat(av[-1]):
                return True
        elif op == sre.BRANCH and any(_empty_repeat(alt) for alt in av[1]):
            return True
    return False


def _repetition(item: str, min_items: Any, max_items: Any, separator_rule: str | None = None,
                item_rule_is_literal: bool = False) -> str:
    """`item` repeated min..max times (max None: unbounded), joined by `separator_rule`: llama.cpp's C++
    build_repetition, which llama.cpp expands into rules when it parses the grammar."""
    lo, hi = _count(min_items, "minimum"), None if max_items is None else _count(max_items, "maximum")
    if hi is not None and lo > hi:
        raise GrammarError(f"cannot use this JSON schema: a minimum count {lo} above its maximum {hi}")
    if hi == 0:
        return ""
    if separator_rule:
        rest = _repetition(f"({separator_rule} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
        return f"{item} {rest}" if lo else f"({item} {rest})?"
    return _braces(item, lo, hi)


def _braces(item: str, lo: int, hi: int | None) -> str:
    if hi is not None and hi > MAX_REPEAT:
        hi = None  # llama.cpp reads a larger bound as none; the grammar says so
    if lo > MAX_REPEAT:
        q, r = divmod(lo, _CHUNK)
        if q > MAX_REPEAT:
            raise GrammarError(f"cannot use this JSON schema: a minimum count {lo} above "
                               f"{MAX_REPEAT * _CHUNK}")
        return f"({item}{{{_CHUNK}}}){{{q}}} {_braces(item, r, None)}"
    if hi is None:
        return f"{item}*" if lo == 0 else f"{item}+" if lo == 1 else f"{item}{{{lo},}}"
    if (lo, hi) == (0, 1):
        return f"{item}?"
    return f"{item}{{{lo}}}" if lo == hi else f"{item}{{{lo},{hi}}}"


def _count(v: Any, what: str) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise GrammarError(f"cannot use this JSON schema: a {what} count must be a non-negative integer, got {v!r}")
    return v


port._build_repetition = _repetition  # the port's converter calls it by this name (strings, arrays, patterns)
# A string's character as llama.cpp's converter now writes it: no raw control character, which JSON forbids inside
# a string. The port's older rule ([^"\\]) let a model end a line inside a string, and the answer did not parse.
port.PRIMITIVE_RULES["char"] = port.BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])', [])


class Grammar:
    """One state of a GBNF grammar over `model`'s vocabulary: which tokens may come next (`mask`, `allows`),
    and the state after a token (`accept`, on a `clone` to keep this one). Wraps llama.cpp's grammar sampler.

    `accept` must only see allowed tokens: llama.cpp aborts the process on a token its grammar rejects, so
    callers check `allows` first (constrain.py does)."""

    def __init__(self, model: "Model", gbnf: str, root: str = "root", *, _smpl: Any = None) -> None:
        self._vocab = model._model.vocab
        self.n_vocab = model.n_vocab
        if _smpl is None:
            check_gbnf(gbnf)
            with suspected("llama.cpp's grammar parser, on a request's grammar or JSON schema",
                           "a simpler grammar or schema (and tell us which one: check_gbnf let it through)"):
                _smpl = llama_cpp.llama_sampler_init_grammar(self._vocab, gbnf.encode("utf-8"),
                                                             root.encode("utf-8"))
            if not _smpl:
                raise GrammarError("llama.cpp could not parse the grammar (GBNF syntax, or no rule "
                                   f"'{root}'); check it with llama.cpp's grammar docs")
        self._smpl = _smpl
        self._model = model  # keeps the vocabulary alive as long as this state
        self._one, self._full = _TokenArray(1), _TokenArray(self.n_vocab)  # scratch, shared with clones

    def clone(self) -> "Grammar":
        g = Grammar.__new__(Grammar)
        g._vocab, g.n_vocab, g._model, g._one, g._full = self._vocab, self.n_vocab, self._model, self._one, self._full
        g._smpl = llama_cpp.llama_sampler_clone(self._smpl)
        return g

    def mask(self) -> np.ndarray:
        """bool [n_vocab]: True where the grammar allows the token next (end-of-generation only when complete)."""
        a = self._full
        a.data.logit[:] = 0.0
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(a.c))
        return np.isfinite(a.data.logit)

    def allows(self, token: int) -> bool:
        a = self._one
        a.data.id[0], a.data.logit[0] = token, 0.0
        a.c.size = 1
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(a.c))
        return bool(np.isfinite(a.data.logit[0]))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._smpl, token)

    def close(self) -> None:
        if getattr(self, "_smpl", None):
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    __del__ = close


class _TokenArray:
    """A llama_token_data_array over numpy storage: ids 0..n-1, logits 0 (the grammar only sets -inf)."""

    def __init__(self, n: int) -> None:
        self.data = np.recarray((n,), dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)],
                                                    align=True))
        self.data.id[:] = np.arange(n, dtype=np.intc)
        self.data.logit[:] = 0.0
        self.data.p[:] = 0.0
        self.c = llama_cpp.llama_token_data_array(data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                  size=n, selected=-1, sorted=False)
