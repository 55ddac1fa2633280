"""Grammars and schemas chosen to blow up llama.cpp's grammar parser or matcher: each is refused with a 400's
GrammarError that names its limit before llama.cpp sees it, or, let through, is parsed and applied in bounded
time and memory.

The llama.cpp side runs in a child (tests/hostile_child.py) under a memory limit, so that a grammar that would
take the server down (the OOM killer, std::bad_alloc) or hold it (minutes on one token) fails this test
instead of the test run. The generators aim at what llama.cpp's src/llama-grammar.cpp expands or follows:
repetition bounds (inverted, past MAX_REPETITION_THRESHOLD, nested), parts that may match nothing in a row,
wide alternatives, deep groups, code points past Unicode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.backend import GrammarError, json_schema_grammar
from localspec.backend.grammar_bounds import MAX_ELEMENTS, MAX_REPEAT, MAX_STACKS, check_gbnf

CHILD = Path(__file__).with_name("hostile_child.py")
MEMORY = 3 << 30  # the child's address space: the issue's {5,1} hit std::bad_alloc under this, 21 GB without it
DEADLINE_S = 120.0  # a hang, not a speed limit: each grammar below takes well under a second once bounded

# The issue's grammars: each killed, held or broke the server before
ISSUE = {
    "inverted-bounds": 'root ::= "a"{5,1}',
    "inverted-to-zero": 'root ::= "a"{1,0}',
    "optional-run": "root ::= " + " ".join(['("a"?)'] * 2000),
    "alternatives-50k": "root ::= " + " | ".join(f'"w{i}"' for i in range(50_000)),
    "past-unicode": 'root ::= "\\U99999999"',
}


def run_child(model: Path, grammars: list[str], memory: int = MEMORY, timeout: float = DEADLINE_S) -> list[dict]:
    """Each grammar's verdict from a child under `memory` bytes of address space; fails on a crash or a hang."""
    proc = subprocess.run([sys.executable, str(CHILD), str(model), str(memory)], input=json.dumps(grammars),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"the child ended with {proc.returncode}: {proc.stderr[-2000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("name", ISSUE)
def test_the_issues_grammars_are_refused_naming_the_limit(name):
    with pytest.raises(GrammarError, match="lower bound|too wide|U\\+10FFFF"):
        check_gbnf(ISSUE[name])


def test_the_issues_grammars_leave_llama_cpp_alive_under_a_memory_limit(smollm2_path):
    """Before the bounds, the first two ended the child (std::bad_alloc at 3 GB) and the third held it past the
    deadline; now every one is refused before llama.cpp parses it."""
    verdicts = run_child(smollm2_path, list(ISSUE.values()))
    assert [v["verdict"] for v in verdicts] == ["refused"] * len(ISSUE)


@pytest.mark.parametrize("gbnf, limit", [
    ('root ::= "a"{2001}', "MAX_REPETITION_THRESHOLD"),
    ('root ::= ("a"{0,100}){0,100}', "MAX_REPETITION_THRESHOLD"),  # llama.cpp's own check, mirrored
    ('root ::= "' + "x" * 5000 + '"{2000}', f"at most {MAX_ELEMENTS}"),
    ("root ::= " + " | ".join(f'"{i}"' for i in range(MAX_STACKS + 1)), f"more than {MAX_STACKS} ways"),
    ("root ::= x{0,1500}\nx ::= (" + " | ".join(f'"{i}"' for i in range(2)) + ")?", f"more than {MAX_STACKS}"),
    ('root ::= [\\U00110000]', "U+10FFFF"),
])
def test_each_limit_names_itself(gbnf, limit):
    with pytest.raises(GrammarError, match=limit.replace("+", "\\+")):
        check_gbnf(gbnf)


@pytest.mark.parametrize("gbnf", [
    'root ::= "a"{0,2000} "b"{2000} [a-z]{3,9}',
    "root ::= " + " | ".join(f'"{i}"' for i in range(MAX_STACKS)),
    'root ::= ("a" | "b"){10} "\\U0010FFFF"',
    'root ::= "{" ws ( kv ( "," ws kv )* )? "}"\nkv ::= [a-z]+ ws ":" ws [0-9]+\nws ::= [ \\t\\n]*',
])
def test_grammars_within_the_limits_pass(gbnf):
    check_gbnf(gbnf)


def test_schema_grammars_pass_the_bounds():
    """What the JSON-schema converter writes for ordinary schemas stays inside every limit."""
    schemas = [{"type": "object", "properties": {f"p{i}": {"type": ["string", "number", "null"]} for i in range(60)}},
               {"type": "array", "items": {"type": "string", "maxLength": 1999}, "maxItems": 1999},
               {"enum": [f"value {i}" for i in range(1000)]},
               {"type": "string", "pattern": "^[A-Z]{2}-\\d{4,8}(-[a-z]+)?$"}]
    for schema in schemas:
        check_gbnf(json_schema_grammar(schema))


def test_a_huge_enum_is_refused_as_too_wide():
    with pytest.raises(GrammarError, match="too wide"):
        check_gbnf(json_schema_grammar({"enum": [f"v{i}" for i in range(10_000)]}))


# -- generators aimed at the parser's and the matcher's blow-ups --

_atoms = st.sampled_from(['"a"', '"ab"', "[a-c]", "[^x]", ".", '""', "x", "y"])
_bounds = st.tuples(st.integers(0, 3000), st.integers(0, 3000) | st.none()).map(
    lambda b: f"{{{b[0]}}}" if b[1] == b[0] else f"{{{b[0]},{'' if b[1] is None else b[1]}}}")
_suffix = st.sampled_from(["", "", "?", "*", "+"]) | _bounds


@st.composite
def _expr(draw, depth: int = 0) -> str:
    """A sequence of atoms and groups, each maybe repeated, and some copied many times in a row or as many
    alternatives: what llama.cpp expands, and the ways its matcher follows."""
    parts = []
    for _ in range(draw(st.integers(1, 4 if depth else 10))):
        if depth < 3 and draw(st.integers(0, 3)) == 0:
            part = "(" + " | ".join(draw(_expr(depth + 1)) for _ in range(draw(st.integers(1, 3)))) + ")"
        else:
            part = draw(_atoms)
        part += draw(_suffix)
        copies = draw(st.sampled_from([1, 1, 1, 2, 8] + ([300, 1100, 2500] if depth == 0 else [])))
        parts.append((" | " if draw(st.booleans()) and copies > 2 else " ").join([part] * copies))
        if parts[-1].count(" | "):
            parts[-1] = f"({parts[-1]})"
    return " ".join(parts)


@st.composite
def grammars(draw) -> str:
    root = draw(_expr())
    return f"root ::= {root}\nx ::= {draw(_expr(2))}\ny ::= \"y\" {draw(_suffix)}"


@given(grammars())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_bounds_check_only_ever_refuses(gbnf):
    """check_gbnf ends quickly with a pass or a GrammarError on any grammar, never another exception."""
    try:
        check_gbnf(gbnf)
    except GrammarError:
        pass


def _sample(strategy: st.SearchStrategy, n: int) -> list:
    out: list = []

    @given(strategy)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def collect(x) -> None:
        out.append(x)

    collect()
    return out


def test_what_the_bounds_let_through_llama_cpp_parses_and_applies(smollm2_path):
    """The generated grammars check_gbnf passes are parsed, masked and followed by llama.cpp in the child,
    under the memory limit and the deadline (a grammar that blew up would end or hold the child)."""
    passed = []
    for gbnf in _sample(grammars(), 250):
        try:
            check_gbnf(gbnf)
        except GrammarError:
            continue
        passed.append(gbnf)
    assert len(passed) >= 10, "the generator should make grammars that pass too"
    verdicts = run_child(smollm2_path, passed[:60])
    assert len(verdicts) == len(passed[:60])


@st.composite
def schemas(draw, depth: int = 0) -> dict:
    """JSON schemas with the keywords the converter expands: bounds, enums, patterns, nesting."""
    kind = draw(st.sampled_from(["string", "array", "object", "enum", "pattern"] if depth < 3 else ["string", "enum"]))
    if kind == "string":
        lo = draw(st.integers(0, 5000))
        return {"type": "string", "minLength": lo, "maxLength": draw(st.integers(0, 600_000))}
    if kind == "enum":
        return {"enum": [f"e{i}" for i in range(draw(st.integers(1, 3000)))]}
    if kind == "pattern":
        return {"type": "string", "pattern": draw(st.sampled_from(
            ["^a{5,1}$", "^(ab){0,3000}$", "^[a-z]{2000,}$", "^(a|b|c){1,2000}x$", "^\\d{1,1999}$"]))}
    if kind == "array":
        return {"type": "array", "items": draw(schemas(depth + 1)), "minItems": draw(st.integers(0, 3)),
                "maxItems": draw(st.integers(0, 3000))}
    n = draw(st.integers(1, 30))
    return {"type": "object", "properties": {f"p{i}": draw(schemas(depth + 1)) for i in range(n)}}


def test_what_schemas_let_through_llama_cpp_parses_and_applies(smollm2_path):
    passed = []
    for schema in _sample(schemas(), 200):
        try:
            gbnf = json_schema_grammar(schema)
            check_gbnf(gbnf)
        except GrammarError:
            continue
        passed.append(gbnf)
    assert passed
    verdicts = run_child(smollm2_path, passed[:40])
    assert len(verdicts) == len(passed[:40])


def test_the_repetition_limit_is_llama_cpps():
    assert MAX_REPEAT == 2000
