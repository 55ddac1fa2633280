"""No grammar takes the process down: a schema's large bounds become llama.cpp's `{m,n}` repetitions (as
llama-server's converter writes them), annotation-only subschemas mean any value, and a GBNF deep enough to
overflow llama.cpp's recursive parser or wide enough to stall its left-recursion check is refused first.
"""

from __future__ import annotations

import json

import pytest

from localspec.backend import Grammar, GrammarError, json_schema_grammar
from localspec.backend.grammar import MAX_DEPTH, MAX_NESTING, check_gbnf, repeats_an_empty_match


def _root(schema: dict) -> str:
    return next(line for line in json_schema_grammar(schema).splitlines() if line.startswith("root ::="))


@pytest.mark.parametrize("schema, rule", [
    ({"type": "string", "maxLength": 524288}, 'root ::= "\\"" char* "\\"" space'),  # llama.cpp: > 2000 is no bound
    ({"type": "string", "minLength": 2, "maxLength": 5000}, 'root ::= "\\"" char{2,} "\\"" space'),
    ({"type": "string", "minLength": 3, "maxLength": 9}, 'root ::= "\\"" char{3,9} "\\"" space'),
    ({"type": "string", "minLength": 4500}, 'root ::= "\\"" (char{1000}){4} char{500,} "\\"" space'),
    ({"type": "array", "items": {"type": "null"}, "minItems": 1, "maxItems": 3},
     'root ::= "[" space null ("," space null){0,2} "]" space'),
    ({"type": "array", "items": {"type": "null"}, "maxItems": 100000},
     'root ::= "[" space (null ("," space null)*)? "]" space'),
    ({"type": "string", "pattern": "^a{2,3}b{0,99999}$"}, 'root ::= "\\"" "a"{2,3} "b"* "\\"" space'),
])
def test_bounds_are_repetitions(schema, rule):
    assert _root(schema) == rule


@pytest.mark.parametrize("schema", [{"description": "any"}, True, {"title": "t", "examples": [1]}])
def test_an_annotation_only_subschema_is_any_value(schema):
    gbnf = json_schema_grammar({"type": "object", "properties": {"x": schema}, "required": ["x"]})
    assert "x ::= value" in gbnf


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 5, "maxLength": 2}, {"type": "string", "maxLength": -1},
    {"type": "string", "maxLength": "9"}, {"type": "array", "items": False}, {"type": "string", "minLength": 10**10}])
def test_impossible_bounds_are_errors(schema):
    with pytest.raises(GrammarError):
        json_schema_grammar(schema)


DEEP = [
    "root ::= " + "(" * 100_000 + '"a"' + ")?" * 100_000,  # parser recursion: SIGSEGV at ~20k on an 8 MB stack
    "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(100_000)) + 'r100000 ::= "a"',
    'root ::= r1{0,1999}\nr1 ::= r0{0,1999}\nr0 ::= "a"?',  # a chain of 4M rules that match nothing
    "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} | r{i + 1} "x"\n' for i in range(60)) + 'r60 ::= "a"',  # 2^60 paths
    'root ::= root "a" | "b"',
    "root ::= " + "(" * 50_000 + " ~",  # unreadable after a deep prefix
]


@pytest.mark.parametrize("gbnf", DEEP, ids=["nesting", "chain", "nullable-chain", "paths", "left-recursion", "junk"])
def test_a_deep_grammar_is_refused_before_llama_cpp(gbnf):
    with pytest.raises(GrammarError):
        check_gbnf(gbnf)


def test_limits_leave_room_for_schemas():
    assert MAX_NESTING >= 100 and MAX_DEPTH >= 2000
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1999} for i in range(40)}}
    check_gbnf(json_schema_grammar(schema))


def test_the_grammars_parse_and_constrain(smollm2_target):
    """The converted grammars are ones llama.cpp parses; the deep ones are GrammarErrors, the process lives."""
    for schema in [{"type": "string", "maxLength": 524288}, {"type": "string", "minLength": 4500},
                   {"type": "array", "items": {"type": "string", "maxLength": 5000}, "maxItems": 3000},
                   {"type": "object", "properties": {"x": {"description": "any"}}, "required": ["x"]}]:
        g = Grammar(smollm2_target, json_schema_grammar(schema))
        assert g.mask().any()
    for gbnf in DEEP:
        with pytest.raises(GrammarError):
            Grammar(smollm2_target, gbnf)
    g = Grammar(smollm2_target, json_schema_grammar({"type": "string", "minLength": 2, "maxLength": 3}))
    for t in smollm2_target.tokenize(json.dumps("ab"), add_special=False):
        assert g.allows(t)
        g.accept(t)


def test_a_crash_while_llama_cpp_parses_a_grammar_names_the_grammar(monkeypatch):
    """Were a grammar to get past check_gbnf and crash llama.cpp's parser, the watching parent's line names the
    grammar, not the CPU's fast paths (crash.suspected); the note is gone once the parse returns."""
    import ctypes
    import os
    import signal
    from types import SimpleNamespace

    import llama_cpp

    from localspec.crash import _suspect_path, crash_line

    fake = SimpleNamespace(_model=SimpleNamespace(vocab=None), n_vocab=1)
    pid = os.fork()
    if pid == 0:  # the child parses a grammar and crashes there
        monkeypatch.setattr(llama_cpp, "llama_sampler_init_grammar", lambda *a: ctypes.string_at(0))
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        Grammar(fake, 'root ::= "a"')  # type: ignore[arg-type]
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
    line = crash_line(signal.SIGSEGV, pid)
    assert "grammar parser" in line and "--no-repack" not in line
    monkeypatch.setattr(llama_cpp, "llama_sampler_init_grammar", lambda *a: None)
    with pytest.raises(GrammarError):
        Grammar(fake, 'root ::= "a"')  # type: ignore[arg-type]
    assert not _suspect_path(os.getppid(), os.getpid()).exists()  # nothing left noted for this process


@pytest.mark.parametrize("pattern", ["^((a?){0,1999}){0,1999}$", "(a?)*", "^(a?){0,9}$", "(a|)+", "^(\\s*)+$"])
def test_a_pattern_that_repeats_an_empty_match_is_refused(pattern):
    assert repeats_an_empty_match(pattern)
    with pytest.raises(GrammarError, match="repeats a part that can match nothing"):
        json_schema_grammar({"type": "string", "pattern": pattern})


@pytest.mark.parametrize("pattern", ["^[a-z]*$", "^\\d{3}-\\d{4}$", "^(-\\d+)*$", "^(\\s*,\\s*)*$", "^(ab)?$",
                                     "^(foo|bar)+$"])
def test_ordinary_patterns_still_make_grammars(pattern):
    assert not repeats_an_empty_match(pattern)
    assert json_schema_grammar({"type": "string", "pattern": pattern})


def test_a_string_holds_no_raw_control_character(smollm2_target):
    """JSON forbids a raw newline inside a string: a schema's strings take it escaped only (llama.cpp's converter
    writes `char` that way; the port's older rule let a title end a line mid-string, and the answer did not parse)."""
    g = Grammar(smollm2_target, json_schema_grammar({"type": "object", "properties": {"title": {"type": "string"}}}))
    for t in smollm2_target.tokenize('{"title": "Hello', add_special=False):
        assert g.allows(t)
        g.accept(t)
    (newline,) = smollm2_target.tokenize("\n", add_special=False)
    assert not g.allows(newline)
    assert g.allows(smollm2_target.tokenize("\\n", add_special=False)[0])
