"""No JSON schema takes the server down: property-based schemas, huge bounds and deep patterns among
them, through every route that takes one (tool parameters, `response_format`, Anthropic's `input_schema` and
`output_config.format`, Ollama's `format` and tools, the Responses API's `text.format` and function tools,
llama.cpp's `json_schema` and `grammar`), to one real
server. Each answer is a 200 or an error in the protocol's shape, and the server answers /health after each.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BOUNDS = st.one_of(st.integers(0, 6), st.integers(0, 3000), st.sampled_from([5000, 524288, 10**9, -1]))
PATTERNS = st.sampled_from(["^a{0,100000}$", "^(a?){0,1999}$", "^((a?){0,1999}){0,1999}$", "^[a-z]+$",
                            "^(ab|c)*d{2,5000}$", "(unbalanced", "^x{3}$", "^a{5,2}$", "^(((((a)))))$"])
NAMES = st.sampled_from(["a", "b", "path", "value", "root", "space", "x y", "é"])
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=4))
LEAVES = st.one_of(
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"minLength": BOUNDS, "maxLength": BOUNDS, "pattern": PATTERNS,
                                    "format": st.sampled_from(["date", "uuid", "time", "date-time", "email"])}),
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])},
                          optional={"minimum": st.integers(-10**6, 10**6), "maximum": st.integers(-10**6, 10**6)}),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}, True, False, {"type": "nonsense"}]),
    st.fixed_dictionaries({"description": st.text(max_size=8)}),
    st.fixed_dictionaries({"enum": st.lists(JSON_VALUES, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"const": JSON_VALUES}),
)
SCHEMAS = st.recursive(LEAVES, lambda kids: st.one_of(
    st.fixed_dictionaries({"type": st.just("array"), "items": kids}, optional={"minItems": BOUNDS, "maxItems": BOUNDS}),
    st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(NAMES, kids, max_size=4)},
                          optional={"required": st.lists(NAMES, max_size=2),
                                    "additionalProperties": st.one_of(st.booleans(), kids)}),
    st.fixed_dictionaries({"anyOf": st.lists(kids, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"type": st.lists(st.sampled_from(["string", "integer", "null"]), min_size=1,
                                            max_size=3, unique=True)}),
), max_leaves=6)


def _object(schema: Any) -> dict:
    return {"type": "object", "properties": {"arg": schema}, "required": ["arg"]}


def _tool(schema: Any) -> dict:
    return {"type": "function", "function": {"name": "f", "description": "d", "parameters": _object(schema)}}


MSG = [{"role": "user", "content": "hi"}]
OLLAMA = {"model": "smollm2-135m", "messages": MSG, "stream": False, "options": {"num_predict": 3}}
ROUTES = {  # route -> (path, body for a schema)
    "chat response_format": ("/v1/chat/completions", lambda s: {
        "messages": MSG, "max_tokens": 3, "response_format": {"type": "json_schema", "json_schema": {"schema": s}}}),
    "chat tools": ("/v1/chat/completions", lambda s: {
        "messages": MSG, "max_tokens": 3, "tools": [_tool(s)], "tool_choice": "required"}),
    "anthropic input_schema": ("/v1/messages", lambda s: {
        "messages": MSG, "max_tokens": 3, "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "description": "d", "input_schema": _object(s)}]}),
    "ollama format": ("/api/chat", lambda s: {**OLLAMA, "format": s}),
    "ollama tools": ("/api/chat", lambda s: {**OLLAMA, "tools": [_tool(s)]}),
    "anthropic output_config": ("/v1/messages", lambda s: {
        "messages": MSG, "max_tokens": 3, "output_config": {"format": {"type": "json_schema", "schema": s}}}),
    "responses text.format": ("/v1/responses", lambda s: {
        "input": "hi", "max_output_tokens": 3, "text": {"format": {"type": "json_schema", "name": "x", "schema": s}}}),
    "responses tools": ("/v1/responses", lambda s: {
        "input": "hi", "max_output_tokens": 3, "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": _object(s)}]}),
    "completion json_schema": ("/completion", lambda s: {"prompt": "hi", "n_predict": 3, "json_schema": s}),
}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--ctx", "2048", "--threads", "2"]) as srv:
        yield srv


def _post(url: str, body: dict) -> tuple[int, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _error_shaped(path: str, body: Any) -> bool:
    if path.startswith("/api/"):
        return isinstance(body.get("error"), str)
    if path.startswith("/v1/messages"):
        return body.get("type") == "error" and isinstance(body["error"].get("message"), str)
    return isinstance(body.get("error"), dict) and isinstance(body["error"].get("message"), str)


def _alive(srv: ServerProcess) -> bool:
    with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:
        return srv.alive and r.status == 200


def _check(srv: ServerProcess, route: str, schema: Any) -> None:
    path, body = ROUTES[route]
    status, answer = _post(srv.url + path, body(schema))
    assert status in (200, 400, 422), (route, schema, status, answer)
    if status != 200:
        assert _error_shaped(path, answer), (route, answer)
    assert _alive(srv), "".join(srv.log[-20:])


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, route=st.sampled_from(sorted(ROUTES)))
def test_any_schema_is_a_grammar_or_a_400(server, schema, route):
    _check(server, route, schema)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_the_schemas_that_crashed_it(server, route):
    """Claude Code's {"type": "string", "maxLength": 524288} (SIGSEGV), 5000 (a 400), and {"description": ...}."""
    for schema in ({"type": "string", "maxLength": 524288}, {"type": "string", "maxLength": 5000},
                   {"description": "any value"}):
        path, body = ROUTES[route]
        status, answer = _post(server.url + path, body(schema))
        assert status == 200, (route, schema, answer)
        assert _alive(server)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_pattern_repeating_an_empty_match_is_a_400(server, route):
    """A fuzzed schema's pattern: llama.cpp's grammar for it held the generation thread for minutes."""
    path, body = ROUTES[route]
    status, answer = _post(server.url + path, body({"type": "string", "pattern": "^((a?){0,1999}){0,1999}$"}))
    assert status in (400, 422) and _error_shaped(path, answer), (route, status, answer)
    assert _alive(server)


@pytest.mark.parametrize("gbnf", ["root ::= " + "(" * 100_000 + '"a"' + ")?" * 100_000,
                                  "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(60_000))
                                  + 'r60000 ::= "a"'], ids=["100000-nested-groups", "60000-chained-rules"])
def test_a_deep_gbnf_is_a_400(server, gbnf):
    status, answer = _post(server.url + "/completion", {"prompt": "hi", "n_predict": 2, "grammar": gbnf})
    assert status == 400 and "grammar" in answer["error"]["message"]
    assert _alive(server)
