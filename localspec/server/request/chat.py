"""A chat request's translation into one `ChatPlan` (engine/chatplan.py), which the engine renders once: the
prompt on `/v1/chat/completions`, `/api/chat`, `/v1/messages`, `/v1/responses`, `/apply-template` and the token
count routes.

Each protocol first puts its messages in OpenAI's terms (`chat_messages` here; Ollama's in chat_tools.py,
Anthropic's in protocols/anthropic/convert.py, the Responses API's in protocols/responses_request.py); `chat_plan` then
checks the tools and plans them once, with the messages and template variables the template reads.

Assistant prefill: when the last message is the assistant's, the template is applied to the messages before it
(with the generation prompt) and that message's text is appended, so the model continues it rather than
starting a new turn (its text parts joined by a blank line, as llama-server joins them; other messages' parts
are joined with nothing). `continue_final_message: false` turns that off (the assistant message is a finished
turn); `true` demands a final assistant message. Two assistant messages at the end are a 400, as in
llama-server: only the last one could be continued; so are `continue_final_message` with `add_generation_prompt:
true`, and continuing a message that made tool calls. `add_generation_prompt: false` renders the messages as they
are, without the assistant's turn opening.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from ...engine.chatplan import ChatPlan, plan_chat
from ...engine.engine import ChatTemplateError, Engine
from ...engine.tools import ToolChoiceError
from ..http import ApiError
from .chat_tools import check_tools, is_legacy, legacy_tools, ollama_messages, reasoning_format
from .schemas import ChatMessage, OAIChatRequest, OllamaChatRequest


def chat_text(content: str | list[dict[str, Any]] | None) -> str:
    """OpenAI content may be a list of parts; keep the text ones."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")


def prefill_text(content: str | list[dict[str, Any]] | None) -> str:
    """The text of an assistant message the answer continues. Its text parts are joined by a blank line, as
    llama-server joins them (common_chat_msg::render_content): a separator only after some text."""
    if not isinstance(content, list):
        return chat_text(content)
    text = ""
    for p in content:
        if isinstance(p, dict) and p.get("type", "text") == "text":
            text += ("\n\n" if text else "") + str(p.get("text", ""))
    return text


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


def chat_plan(engine: Engine, messages: Sequence[Mapping[str, Any]], *, tools: list[Any] | None = None,
              choice: Any = "auto", parallel: bool = True, reasoning: str = "none",
              context: Mapping[str, Any] | None = None) -> ChatPlan:
    """The plan for OpenAI-style messages and tools on the served model's template; a bad tool or tool_choice is
    a 400 here, before anything is rendered."""
    try:
        return plan_chat(engine.chat_template, messages, tools=check_tools(tools), choice=choice,
                         parallel=parallel, reasoning=reasoning, context=context)
    except ToolChoiceError as e:
        raise ApiError(400, str(e)) from None


def chat_prompt(engine: Engine, plan: ChatPlan) -> str:
    """The plan rendered by the engine; a template that cannot render it is a 400."""
    try:
        return engine.render(plan)
    except ChatTemplateError as e:
        raise ApiError(400, str(e)) from None


# names the template renderer takes as its own arguments (engine.chat_prompt, template.render_chat): a request's
# template variable by one of them would collide with them, not reach the template
RENDERER_ARGS = frozenset({"messages", "template", "bos", "eos", "now"})


def openai_plan(engine: Engine, req: OAIChatRequest, default_reasoning: str) -> ChatPlan:
    """An OpenAI chat request's plan: its tools (or the legacy functions), `chat_template_kwargs`,
    `reasoning_format`, and the prefill rules above."""
    tools, choice, parallel = req.tools, req.tool_choice, req.parallel_tool_calls
    if is_legacy(req):
        (tools, choice), parallel = legacy_tools(req.functions, req.function_call), False
    kwargs = req.chat_template_kwargs or {}
    taken = sorted(kwargs.keys() & RENDERER_ARGS)
    if taken:
        raise ApiError(400, f"chat_template_kwargs may not set {taken[0]!r}: the server passes it to the template "
                            "renderer itself (the messages are the request's own)")
    if not isinstance(kwargs.get("enable_thinking", False), bool):
        raise ApiError(400, 'invalid type for "enable_thinking" (expected boolean, got '
                            f'{type(kwargs["enable_thinking"]).__name__})')
    plan = chat_plan(engine, chat_messages(req), tools=tools, choice=choice, parallel=parallel,
                     reasoning=reasoning_format(req.reasoning_format, default_reasoning), context=kwargs)
    return _turn(plan, req)


def _turn(plan: ChatPlan, req: OAIChatRequest) -> ChatPlan:
    """Whether the answer opens a new turn or continues the final assistant message (see above)."""
    trailing = plan.messages[-1]["role"] == "assistant"
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(400, "Cannot set both add_generation_prompt and continue_final_message to true.")
    if req.continue_final_message and not trailing:
        raise ApiError(400, "continue_final_message needs the last message to be the assistant's")
    if not trailing or req.continue_final_message is False:
        return replace(plan, add_generation_prompt=req.add_generation_prompt is not False)
    if len(plan.messages) > 1 and plan.messages[-2]["role"] == "assistant":
        raise ApiError(400, "Cannot have 2 or more assistant messages at the end of the list.")
    if req.messages[-1].tool_calls or req.messages[-1].function_call:
        raise ApiError(400, "Cannot continue an assistant message that contains tool calls.")
    return replace(plan.continuing(), prefill=prefill_text(req.messages[-1].content))


def ollama_plan(engine: Engine, req: OllamaChatRequest, default_reasoning: str) -> ChatPlan:
    """An Ollama chat request's plan; `think` reaches the template as `enable_thinking` (Qwen 3's switch; other
    templates ignore it)."""
    msgs = ollama_messages([m.model_dump(exclude_none=True) for m in req.messages])
    context = {} if req.think is None else {"enable_thinking": req.think is not False}
    return chat_plan(engine, msgs, tools=req.tools, reasoning=default_reasoning, context=context)
