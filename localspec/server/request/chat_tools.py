"""Tools and reasoning on the chat routes: the checks on a request's `tools` (or the legacy `functions` /
`function_call`) and `reasoning_format` that chat.py applies while it builds the plan, Ollama's chat history in
OpenAI's terms, and the answer (engine/answer.py) in each protocol's shape.

OpenAI: `message.tool_calls` with ids and `finish_reason: "tool_calls"`; streamed, the first delta of a call
carries index, id, type, name and empty arguments and later ones index and argument text; `<think>` blocks as
`reasoning_content` per `--reasoning-format` (llama-server's: `auto` and `deepseek` extract, `none` leaves them).
Ollama: `message.tool_calls` with the arguments as an object and no id, the thinking as `message.thinking`.

When the tool plan has a grammar (a call is required, or the template has no tool syntax) the answer is held to
it from its first token, so a template that opens a think block does not start the answer as reasoning there.
"""

from __future__ import annotations

import json
from typing import Any

from ...engine.answer import Answer, AnswerDelta
from ...engine.reasoning import REASONING_FORMATS
from ...engine.tools import ToolCall
from ..http import ApiError
from .schemas import OAIChatRequest


def check_tools(tools: list[Any] | None) -> list[dict] | None:
    """OpenAI's function tools, `{"type": "function", "function": {"name": ..., "parameters": {...}}}`; anything
    else is a 400 (Ollama sends the same shape)."""
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or t.get("type", "function") != "function":
            raise ApiError(400, 'tools: each tool is {"type": "function", "function": {"name": ..., "parameters": '
                                f'{{...}}}}, got {json.dumps(t)[:80]}')
        if not isinstance(fn.get("parameters") or {}, dict):
            raise ApiError(400, f"tools: the parameters of {fn['name']} must be a JSON schema object")
    return tools or None


def legacy_tools(functions: list[Any] | None, function_call: Any) -> tuple[list[dict] | None, Any]:
    """OpenAI's deprecated `functions` / `function_call` as `tools` / `tool_choice`."""
    tools = [{"type": "function", "function": f} for f in functions or []] or None
    if isinstance(function_call, dict):
        return tools, {"type": "function", "function": {"name": function_call.get("name")}}
    return tools, function_call


def reasoning_format(requested: str | None, default: str) -> str:
    fmt = requested or default
    if fmt not in REASONING_FORMATS:
        raise ApiError(400, f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {fmt!r}")
    return fmt


# -- OpenAI --------------------------------------------------------------------------------------------------------

def is_legacy(req: OAIChatRequest) -> bool:
    """The request uses `functions` (answered with `function_call`), not `tools`."""
    return bool(req.functions) and not req.tools


def openai_message(answer: Answer, *, legacy: bool = False) -> dict[str, Any]:
    """The assistant message: content (null when only calls came), `reasoning_content`, the calls."""
    m: dict[str, Any] = {"role": "assistant", "content": answer.content if answer.content or not answer.calls
                         else None}
    if answer.reasoning:
        m["reasoning_content"] = answer.reasoning
    if answer.calls and legacy:
        m["function_call"] = {"name": answer.calls[0].name, "arguments": answer.calls[0].arguments}
    elif answer.calls:
        m["tool_calls"] = [c.openai() for c in answer.calls]
    return m


def openai_delta(d: AnswerDelta, *, legacy: bool = False) -> dict[str, Any]:
    """One streamed delta's fields (empty when the piece added nothing yet)."""
    out: dict[str, Any] = {}
    if d.reasoning:
        out["reasoning_content"] = d.reasoning
    if d.content:
        out["content"] = d.content
    if d.calls and legacy:
        first = [c for c in d.calls if c.index == 0]
        if first:
            out["function_call"] = dict(first[0].openai()["function"])
    elif d.calls:
        out["tool_calls"] = [c.openai() for c in d.calls]
    return out


def openai_finish(finish: str | None, calls: list[ToolCall], *, legacy: bool = False) -> str | None:
    """`tool_calls` (legacy: `function_call`) when the answer made calls, else the generation's reason."""
    if calls and finish in ("stop", None):
        return "function_call" if legacy else "tool_calls"
    return finish


# -- Ollama --------------------------------------------------------------------------------------------------------

def ollama_message(answer: Answer, think: Any) -> dict[str, Any]:
    """The assistant message: content, `thinking` (unless `think` is false), the calls."""
    m: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.reasoning and think is not False:
        m["thinking"] = answer.reasoning
    if answer.calls:
        m["tool_calls"] = ollama_calls(answer.calls)
    return m


def ollama_messages(messages: list[dict]) -> list[dict]:
    """Ollama's chat history in OpenAI's terms: calls get ids (Ollama's have none) and each tool result the id
    of the call it answers — the next unanswered one of the same name, else the next one."""
    out: list[dict] = []
    pending: list[tuple[str, str]] = []  # (id, name) of calls not yet answered
    for m in messages:
        m = {**m, "content": m.get("content") or ""}
        if m.get("thinking"):  # an earlier answer's reasoning, as the template reads it
            m["reasoning_content"] = m.pop("thinking")
        if m.get("tool_calls"):
            calls: list[dict[str, Any]] = []
            for c in m["tool_calls"]:
                fn = (c or {}).get("function") or {}
                cid = f"call_{len(out)}_{len(calls)}"
                calls.append({"id": cid, "type": "function",
                              "function": {"name": fn.get("name", ""), "arguments": fn.get("arguments") or {}}})
                pending.append((cid, fn.get("name", "")))
            m["tool_calls"] = calls
        if m.get("role") == "tool":
            name = m.pop("tool_name", None) or m.get("name")
            match = next((p for p in pending if p[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
                m["tool_call_id"] = match[0]
            m["name"] = name or (match[1] if match else "")
        out.append(m)
    return out


def ollama_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Ollama's shape: the arguments as an object, the call's place in the answer as `index`."""
    return [{"function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments)}}
            for i, c in enumerate(calls)]
