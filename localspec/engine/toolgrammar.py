"""Grammars that make the model's output a valid tool call: built from the request's tools, in the format the
model writes (llama-server's approach).

When a call is required (`tool_choice: "required"` or a named function) the output is constrained to the
format's markers around JSON that matches one allowed tool's schema, so even a tiny model returns a call whose
arguments parse and fit. A model whose template has no tool syntax writes the generic format, which is always
constrained while tools are offered: `{"tool_calls": [...]}` or, under `auto`, `{"response": "..."}` too.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Formats whose markers wrap JSON calls; others fall back to the generic format when a call is required
WRAPPED = ("hermes", "llama3", "mistral")


def allowed_tools(tools: list[dict], choice: Any) -> list[dict]:
    """The function objects a call may name: all of them, or the one `tool_choice` names."""
    fns = [t.get("function", t) for t in tools if isinstance(t, dict)]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        fns = [f for f in fns if f.get("name") == name]
    return fns


def call_schema(fns: list[dict], *, args_key: str = "arguments") -> dict:
    """One call: {"name": <an allowed name>, "<args_key>": <that tool's parameters>}."""
    alts = [{"type": "object",
             "properties": {"name": {"const": f["name"]},
                            args_key: f.get("parameters") or {"type": "object"}},
             "required": ["name", args_key]} for f in fns]
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def generic_schema(fns: list[dict], *, required: bool, parallel: bool) -> dict:
    calls: dict[str, Any] = {"type": "array", "items": call_schema(fns), "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    with_calls = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"]}
    if required:
        return with_calls
    answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    return {"anyOf": [with_calls, answer]}


def _renamed(gbnf: str, root: str) -> str:
    """A converted schema's grammar with its `root` rule renamed, to be used inside another grammar."""
    return re.sub(r"^root ::=", f"{root} ::=", gbnf, flags=re.M)


def _lit(s: str) -> str:
    return json.dumps(s)


def tool_grammar(fmt: str, fns: list[dict], *, required: bool, parallel: bool) -> str | None:
    """GBNF for the output, or None when the output is left free (a native format under `auto`)."""
    from ..backend import json_schema_grammar  # llama.cpp's converter: loaded when a grammar is built

    if fmt == "generic":
        return json_schema_grammar(generic_schema(fns, required=required, parallel=parallel))
    if not required or fmt not in WRAPPED:
        return None
    args_key = "parameters" if fmt == "llama3" else "arguments"
    call = _renamed(json_schema_grammar(call_schema(fns, args_key=args_key)), "tool-call")
    if fmt == "hermes":
        one = f'{_lit("<tool_call>")} "\\n"? tool-call "\\n"? {_lit("</tool_call>")}'
        root = f'root ::= {one}' + (f' ("\\n" {one})*' if parallel else "")
    elif fmt == "mistral":
        more = ' ("," " "? tool-call)*' if parallel else ""
        root = f'root ::= {_lit("[TOOL_CALLS]")} "[" tool-call{more} "]"'
    else:
        root = "root ::= tool-call"  # Llama 3.x: one call per answer
    return root + "\n" + call


def generic_instructions(fns: list[dict], *, required: bool, parallel: bool) -> str:
    """The system text that tells a model without tool syntax which tools it has and how to answer."""
    shape = '{"tool_calls": [{"name": "<tool name>", "arguments": {...}}]}'
    lines = ["You can call these tools:", json.dumps(fns, indent=2), "",
             f"Answer with a JSON object. To call {'tools' if parallel else 'a tool'}: {shape}"]
    if not required:
        lines.append('To answer without a tool: {"response": "<your answer>"}')
    return "\n".join(lines)
