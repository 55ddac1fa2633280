"""Anthropic's Messages API shapes, both ways: a request's system, messages and tools as the OpenAI-style lists
the engine's chat template and tool code read (as llama-server converts them), and the engine's answer as
Anthropic's content blocks, stop reason and usage. Pure functions of the request and the run; the routes are
in anthropic.py, the stream's events in anthropic_stream.py.

Conversion: `system` first, with the system-role messages that open `messages` after it; a system-role message
later in `messages` (Claude Code's task notifications) stays where it was sent, so each turn's prompt begins
with the turn before's (the template renders it there, or template.fold_late_system joins it to the user text
around it); text blocks joined, `tool_use` blocks as the assistant's
`tool_calls`, `tool_result` blocks as `tool` messages (before the text of the same user turn, where Anthropic
puts them); custom tools ({name, description, input_schema}) as OpenAI function tools, Anthropic's own tool types
(web search, bash, ...) left out; tool_choice auto / any / tool / none as OpenAI's auto / required / a function /
none; `output_config.format` (a JSON schema) constrains the answer as `response_format` does on the OpenAI routes.
`thinking`, `context_management`, `output_config.effort`, `metadata` and `cache_control` are accepted, ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ....engine.engine import Chunk
from ....engine.tools import ToolCall
from ...execution.run import Run
from ...http import ApiError
from ...request.schemas import MAX_TOKENS
from ...state import State


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # metadata, thinking, output_config, ...: accepted, ignored


class AnthropicMessage(_Body):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Body):
    model: str | None = None
    messages: list[AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="absent: the server's -n, else the "
                                   "context (Anthropic requires it; llama-server does not)")
    stop_sequences: list[str] | None = None
    stream: bool = False
    output_config: dict[str, Any] | None = None  # {"format": {"type": "json_schema", "schema": {...}}}; effort ignored
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=1 << 20)


# -- request -> OpenAI-style messages --------------------------------------------------------------------------

def block_text(content: Any, where: str) -> str:
    """A string, or text blocks joined; an image or document is a 400 (a text model)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content blocks")
    out = []
    for b in content:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            out.append(str(b.get("text", "")))
        elif kind in ("image", "document"):
            raise ApiError(400, f"{where}: {kind} input is not supported (this server runs a text model)")
        elif kind not in ("thinking", "redacted_thinking"):  # thinking: the message's reasoning_content
            raise ApiError(400, f"{where}: unsupported content block type {kind!r}")
    return "".join(out)


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    calls = [{"id": str(b.get("id") or ""), "type": "function",
              "function": {"name": str(b.get("name") or ""), "arguments": json.dumps(b.get("input") or {})}}
             for b in blocks if b.get("type") == "tool_use"]
    msg: dict[str, Any] = {"role": "assistant",
                           "content": block_text([b for b in blocks if b.get("type") != "tool_use"], where)}
    if calls:
        msg["tool_calls"] = calls
    thinking = "".join(str(b.get("thinking") or "") for b in blocks if b.get("type") == "thinking")
    if thinking:  # the reasoning of an earlier answer, for templates that show it (Qwen 3)
        msg["reasoning_content"] = thinking
    return msg


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results first (as `tool` messages), then the turn's text, as Anthropic orders them."""
    out = []
    for b in blocks:
        if b.get("type") == "tool_result":
            text = block_text(b.get("content") or "", f"{where}.tool_result")
            out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""),
                        "content": f"Error: {text}" if b.get("is_error") else text})
    rest = [b for b in blocks if b.get("type") != "tool_result"]
    if rest or not out:
        out.append({"role": "user", "content": block_text(rest, where)})
    return out


def openai_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    system = [block_text(req.system, "system")] if req.system else []
    msgs: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        where = f"messages.{i}.content"
        if m.role == "system" and not msgs:
            system.append(block_text(m.content, where))
        elif m.role == "system":  # mid-conversation: where it was sent, so the prompt before it stays the same
            msgs.append({"role": "system", "content": block_text(m.content, where)})
        elif isinstance(m.content, str):
            msgs.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            msgs.append(_assistant(m.content, where))
        else:
            msgs.extend(_user(m.content, where))
    text = "\n\n".join(t for t in system if t)
    return ([{"role": "system", "content": text}] if text else []) + msgs


def openai_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """{name, description, input_schema} -> OpenAI's function tools. Anthropic's own tool types (web search, code
    execution, bash, ...) are left out: this server runs none of them, and their schemas are Anthropic's."""
    if not tools:
        return None
    out = []
    for t in tools:
        if not isinstance(t, dict) or t.get("type", "custom") not in ("custom", None):
            continue
        schema = t.get("input_schema") or {"type": "object"}
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise ApiError(400, f"tools: a custom tool needs a name, got {json.dumps(t)[:80]}")
        if not isinstance(schema, dict):
            raise ApiError(400, f"tools: input_schema of {t['name']!r} must be a JSON schema object")
        out.append({"type": "function", "function": {"name": t["name"], "parameters": schema,
                                                     "description": str(t.get("description") or "")}})
    return out or None


def tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool]:
    """Anthropic's tool_choice -> (OpenAI's tool_choice, parallel calls allowed)."""
    if choice is None:
        return "auto", True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": str(choice.get("name") or "")}}, parallel
    raise ApiError(400, f"tool_choice.type must be auto, any, tool or none, got {kind!r}")


def response_format(output_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """`output_config.format` (Anthropic's structured output) in `response_format`'s shape, for the grammar."""
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, 'output_config.format must be {"type": "json_schema", "schema": {...}}')
    return {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}


# -- the answer --------------------------------------------------------------------------------------------------

def tool_use_id(call_id: str) -> str:
    """Anthropic's `toolu_` ids from the engine's `call_` ones."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
            "input": args if isinstance(args, dict) else {"value": args}}


def stop_reason(last: Chunk | None, text: str, raw: str, stop: Sequence[str], called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the last chunk. The engine cuts the text where a stop string begins;
    the raw text of every generated token says which string it was. A budget that ran out wins over the calls
    made: Anthropic says `max_tokens` for an answer cut inside its tool_use block (the block is sent as far as it
    got, and the client asks again with a larger budget rather than run it)."""
    if last is not None and last.finish in ("length", "context"):
        return "max_tokens", None
    if called:
        return "tool_use", None
    if last is not None and last.finish == "stop" and last.step.finish != "stop":
        tail = raw[len(text):]
        hit = next((s for s in stop if tail.startswith(s)), stop[0] if len(stop) == 1 else None)
        if hit is not None:
            return "stop_sequence", hit
    return "end_turn", None


def usage(run: Run) -> dict[str, Any]:
    """Anthropic counts cache reads apart from input_tokens (the prompt tokens evaluated). Before the prefill
    (`message_start`) the split is the one the cache promises; after it, the one the prefill found."""
    first, started = run.job.first, run.started
    if first is not None:
        n_in, cached = first.n_prompt, first.n_cached
    else:
        cached = started.n_cached if started else 0
        n_in = started.n_prompt_tokens - cached if started else 0
    return {"input_tokens": n_in, "output_tokens": run.stats.n_generated, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


def message_body(state: State, ident: str, content: list[dict[str, Any]], reason: str | None, seq: str | None,
                 use: dict[str, Any]) -> dict[str, Any]:
    return {"id": ident, "type": "message", "role": "assistant", "model": state.model_name, "content": content,
            "stop_reason": reason, "stop_sequence": seq, "usage": use}
