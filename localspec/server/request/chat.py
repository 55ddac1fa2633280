"""Chat messages -> the prompt text, as llama-server builds it (`/v1/chat/completions`, `/apply-template`, the
input-token count route).

Assistant prefill: when the last message is the assistant's, the template is applied to the messages before it
(with the generation prompt) and that message's text is appended, so the model continues it rather than
starting a new turn. `continue_final_message: false` turns that off (the assistant message is a finished
turn); `true` demands a final assistant message. Two assistant messages at the end are a 400, as in
llama-server: only the last one could be continued; so are `continue_final_message` with `add_generation_prompt:
true`, and continuing a message that made tool calls. `add_generation_prompt: false` renders the messages as they
are, without the assistant's turn opening.
"""

from __future__ import annotations

from typing import Any

from ...engine.engine import ChatTemplateError, Engine
from ..http import ApiError
from .schemas import ChatMessage, OAIChatRequest


def chat_text(content: str | list[dict[str, Any]] | None) -> str:
    """OpenAI content may be a list of parts; keep the text ones."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")


def chat_prompt(engine: Engine, messages: list[dict[str, Any]], **context: Any) -> tuple[str, bool]:
    """The chat template over `messages` (with the generation prompt), as a job's build returns it; `context`:
    what else the template reads (`tools`, `enable_thinking`). A template that cannot render them is a 400."""
    try:
        return engine.chat_prompt(messages, **context), False
    except ChatTemplateError as e:
        raise ApiError(400, str(e)) from None


def chat_messages(req: OAIChatRequest) -> list[dict[str, Any]]:
    """OpenAI messages as the template reads them: text parts joined, `developer` as `system`; calls and tool
    results keep their ids and names, the legacy `function_call` and `function` result become a call and a
    `tool` result."""
    return [_message(m) for m in req.messages]


def _message(m: ChatMessage) -> dict[str, Any]:
    role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
    out: dict[str, Any] = {"role": role, "content": chat_text(m.content)}
    legacy_id = f"call_{m.name or (m.function_call or {}).get('name') or ''}"  # pairs a legacy call and result
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
    elif m.function_call:
        out["tool_calls"] = [{"id": legacy_id, "type": "function", "function": m.function_call}]
    if m.tool_call_id or m.role == "function":
        out["tool_call_id"] = m.tool_call_id or legacy_id
    if m.name:
        out["name"] = m.name
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    return out


def chat_messages_prompt(engine: Engine, req: OAIChatRequest, messages: list[dict[str, Any]] | None = None,
                         **context: Any) -> str:
    """The prompt for `messages` (default: the request's, as chat_messages reads them) with the template's
    `context`; a trailing assistant message is a prefill (see above)."""
    msgs = chat_messages(req) if messages is None else messages
    trailing = msgs[-1]["role"] == "assistant"
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(400, "Cannot set both add_generation_prompt and continue_final_message to true.")
    if req.continue_final_message and not trailing:
        raise ApiError(400, "continue_final_message needs the last message to be the assistant's")
    if not trailing or req.continue_final_message is False:
        return chat_prompt(engine, msgs, add_generation_prompt=req.add_generation_prompt is not False, **context)[0]
    if len(msgs) > 1 and msgs[-2]["role"] == "assistant":
        raise ApiError(400, "Cannot have 2 or more assistant messages at the end of the list.")
    if req.messages[-1].tool_calls or req.messages[-1].function_call:
        raise ApiError(400, "Cannot continue an assistant message that contains tool calls.")
    return chat_prompt(engine, msgs[:-1], **context)[0] + msgs[-1]["content"]


def system_tokens(engine: Engine, req: OAIChatRequest, prompt: str) -> int:
    """Prompt tokens that belong to the leading system messages: what a context shift keeps (llama-server's
    "drop the oldest tokens after the system prompt"). 0 without a system message."""
    msgs = chat_messages(req)
    n = next((i for i, m in enumerate(msgs) if m["role"] != "system"), len(msgs))
    if n == 0:
        return 0
    head = engine.tokenize(chat_prompt(engine, msgs[:n])[0])
    full = engine.tokenize(prompt)
    return next((i for i, (a, b) in enumerate(zip(head, full)) if a != b), min(len(head), len(full)))
