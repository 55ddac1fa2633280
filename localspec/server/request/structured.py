"""Request fields that shape the distribution rather than sample from it: `logit_bias`, structured output
(`response_format`, llama.cpp's `grammar` / `json_schema`, Ollama's `format`), and log-probabilities.

They become `SamplingParams(logprobs=..., constraint=...)`; the constraint masks the target's and the drafter's
rows alike (localspec/sampling/constrain.py), so speculation stays on and the output is exactly the constrained target
distribution. Grammars run on llama.cpp's own engine; a schema or grammar it cannot use is a 400.
"""

from __future__ import annotations

import math
from typing import Any

from ...backend import json_schema_grammar
from ...engine.engine import Engine
from ...sampling.constrain import build_constraint
from ..http import ApiError

JSON_OBJECT = {"type": "object"}  # what llama-server constrains `json_object` to


def request_extras(engine: Engine, *, logit_bias: Any = None, grammar: str | None = None,
                   json_schema: Any = None, response_format: Any = None, ollama_format: Any = None,
                   logprobs: int | None = None, tool_grammar: str | None = None) -> dict[str, Any]:
    """The `SamplingParams` keyword arguments for these fields (empty when the request uses none).
    `tool_grammar`: the tool plan's (engine/toolgrammar.py), which holds the whole answer to a call's shape, so a
    request's own structure beside it is a 400."""
    gbnf = grammar_text(grammar, json_schema, response_format, ollama_format)
    if tool_grammar and gbnf:
        raise ApiError(400, "this request's tools hold the answer to a tool call's grammar (tool_choice required or "
                            "a named function, or a model whose template has no tool syntax); send grammar, "
                            "json_schema, response_format or format without them")
    gbnf = tool_grammar or gbnf
    bias = parse_logit_bias(logit_bias, engine)
    extra: dict[str, Any] = {}
    if logprobs is not None:
        extra["logprobs"] = logprobs
    constraint = build_constraint(engine.target, logit_bias=bias, grammar=gbnf)
    if constraint is not None:
        extra["constraint"] = constraint
    return extra


def grammar_text(grammar: str | None, json_schema: Any, response_format: Any, ollama_format: Any = None) -> str | None:
    """GBNF for the request, from whichever field asked for structure (llama-server's precedence)."""
    if grammar and json_schema is not None:
        raise ApiError(400, "send either `grammar` or `json_schema`, not both")
    schema = json_schema
    if isinstance(response_format, dict):
        kind = response_format.get("type", "text")
        if kind == "json_object":
            schema = response_format.get("schema") or schema or JSON_OBJECT
        elif kind == "json_schema":
            wrapper = response_format.get("json_schema")
            schema = (wrapper or {}).get("schema") if isinstance(wrapper, dict) else None
            if not isinstance(schema, dict):
                raise ApiError(400, "response_format json_schema needs {\"json_schema\": {\"schema\": {...}}}")
        elif kind != "text":
            raise ApiError(400, f"response_format type must be \"text\", \"json_object\" or \"json_schema\", "
                                f"got \"{kind}\"")
    elif response_format is not None:
        raise ApiError(400, "response_format must be an object like {\"type\": \"json_object\"}")
    if ollama_format is not None and ollama_format != "":
        schema = JSON_OBJECT if ollama_format == "json" else ollama_format
        if not isinstance(schema, dict):
            raise ApiError(400, "format must be \"json\" or a JSON schema object")
    if grammar:
        return grammar
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise ApiError(400, "a JSON schema must be an object")
    return json_schema_grammar(schema or JSON_OBJECT)


def parse_logit_bias(value: Any, engine: Engine) -> dict[int, float]:
    """OpenAI's {"token_id": bias} and llama.cpp's [[token_or_text, bias]] / {"token_or_text": bias}, where a
    bias of false bans the token (-inf; OpenAI's -100 does too, in effect). Text stands for all its tokens."""
    if value is None:
        return {}
    items = value.items() if isinstance(value, dict) else value
    if not isinstance(items, (list, type({}.items()))):
        raise ApiError(400, "logit_bias must be an object {\"token_id\": bias} or a list of [token, bias] pairs")
    out: dict[int, float] = {}
    n_vocab = engine.target.n_vocab
    item: Any
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ApiError(400, f"logit_bias entries are [token, bias] pairs, got {item!r}")
        key, bias = item
        b = _bias(bias)
        for t in _tokens(key, engine):
            if not 0 <= t < n_vocab:
                raise ApiError(400, f"logit_bias token id {t} is outside the vocabulary [0, {n_vocab})")
            out[t] = out.get(t, 0.0) + b
    return out


def _bias(v: Any) -> float:
    if v is False:
        return -math.inf
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise ApiError(400, f"a logit_bias value must be a number or false, got {v!r}")


def _tokens(key: Any, engine: Engine) -> list[int]:
    if isinstance(key, int) and not isinstance(key, bool):
        return [key]
    if isinstance(key, str):
        if key.lstrip("-").isdigit():
            return [int(key)]
        return engine.target.tokenize(key, add_special=False, parse_special=False)
    raise ApiError(400, f"a logit_bias token must be an id or a text, got {key!r}")
