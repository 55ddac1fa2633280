"""A Responses API request (`POST /v1/responses`) as the chat routes' plan: its fields, its `input` items as the chat
messages the template reads, its tools and `text.format` in chat terms (the route and its answer: responses.py).

Messages join as llama-server joins them once it has made the input a chat request: consecutive items of one role
are one message, and an input that ends with the assistant's text is continued (its parts joined by a blank line).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...engine.chatplan import ChatPlan
from ..http import ApiError
from ..request.chat import chat_plan, chat_prompt, prefill_text
from ..request.schemas import MAX_TOKENS
from ..state import State

TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # store, metadata, user, truncation, ...: accepted, ignored

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=1 << 20)  # llama.cpp's
    min_p: float | None = Field(None, ge=0, le=1)  # llama.cpp's
    stream: bool = False
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    timings_per_token: bool = False  # llama-server's: a `timings` block on each round's last streamed event
    return_progress: bool = False  # llama-server's: `response.in_progress` events with `prompt_progress`


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content parts")
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise ApiError(400, f"{where}: content part type {kind!r} is not supported (text parts only)")
        out.append(str(part.get("text", "")))
    return "".join(out)


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """`instructions` and `input` as the chat messages the template reads."""
    system = [req.instructions] if req.instructions else []
    if isinstance(req.input, str):
        return _with_system(system, [{"role": "user", "content": req.input}])
    msgs: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        kind, role = item.get("type", "message"), item.get("role")
        if kind == "function_call":
            call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": str(item.get("name") or ""), "arguments": str(item.get("arguments") or "")}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                         "content": out if isinstance(out, str) else _content(out or "", f"input.{i}.output")})
        elif kind == "reasoning":
            continue  # earlier thinking is not shown to the template
        elif kind != "message" or not isinstance(role, str) or role not in ROLES:
            raise ApiError(400, f"input.{i}: items are messages (role user, assistant, system or developer), "
                                f"function_call, function_call_output or reasoning; got type {kind!r}, role {role!r}")
        elif ROLES[role] == "system" and not msgs:
            system.append(_content(item.get("content"), f"input.{i}.content"))
        elif ROLES[role] == "system":  # mid-conversation: where it was sent, so the prompt before it stays the same
            msgs.append({"role": "system", "content": _content(item.get("content"), f"input.{i}.content")})
        else:
            _add_message(msgs, ROLES[role], _content(item.get("content"), f"input.{i}.content"))
    return _with_system(system, msgs)


def _add_message(msgs: list[dict[str, Any]], role: str, text: str) -> None:
    """Adds a message; one right after a message of the same role joins it (assistant text after its turn's
    calls too). Codex sends its environment and the prompt as two user messages, and echoes a call and the text
    beside it as two items; templates that want turns to alternate (Gemma's) refuse two of one role in a row."""
    last = msgs[-1] if msgs else None
    if last is not None and last["role"] == role:
        last["content"] = "\n\n".join(t for t in (last["content"], text) if t)
    else:
        msgs.append({"role": role, "content": text})


def _with_system(system: list[str], msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = "\n\n".join(t for t in system if t)
    return ([{"role": "system", "content": text}] if text else []) + msgs


def function_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The Responses API's function tools ({type, name, description, parameters}) in the chat routes' shape;
    tools this server cannot run (web_search, file_search, a namespace, MCP, ...) are left out."""
    out = [{"type": "function", "function": {"name": t.get("name"), "description": str(t.get("description") or ""),
                                             "parameters": t.get("parameters") or {"type": "object"}}}
           for t in tools or [] if isinstance(t, dict) and t.get("type") == "function"]
    return out or None


def chat_choice(choice: str | dict[str, Any] | None) -> Any:
    """`tool_choice` as the chat routes take it: auto / none / required, or {"type": "function", "name": ...}."""
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "auto"  # a hosted tool's choice (web_search, ...): that tool is not offered here


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` in `response_format`'s shape (the Responses API puts the schema one level up)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, "text.format must be an object like {\"type\": \"json_object\"}")
    if fmt.get("type") != "json_schema":
        return fmt
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, "text.format of type json_schema needs a `schema` object")
    return {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}


def setup(state: State, req: ResponsesRequest) -> tuple[ChatPlan, str]:
    """The chat plan and its prompt; a bad message list, tool or tool_choice is a 400 here. An input that ends with
    the assistant's text is continued, as llama-server continues it once the input is a chat request."""
    tools = function_tools(req.tools)
    chat = chat_plan(state.engine, input_messages(req), tools=tools, choice=chat_choice(req.tool_choice) if tools
                     else "auto", parallel=req.parallel_tool_calls, reasoning=state.config.reasoning_format)
    last = chat.messages[-1] if chat.messages else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        chat = replace(chat.continuing(), prefill=prefill_text(trailing_parts(req)))
    return chat, chat_prompt(state.engine, chat)


def trailing_parts(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The text parts of the assistant message items that end the input (one message, as llama-server merges
    them), in order: a continued message's parts are joined by a blank line there, not with nothing."""
    parts: list[dict[str, Any]] = []
    for item in reversed(req.input if isinstance(req.input, list) else []):
        if item.get("type", "message") == "reasoning":
            continue
        if item.get("type", "message") != "message" or item.get("role") != "assistant":
            break
        content = item.get("content")
        parts[:0] = [{"type": "text", "text": content}] if isinstance(content, str) else [
            {"type": "text", "text": str(p.get("text", ""))} for p in content or [] if isinstance(p, dict)]
    return parts
