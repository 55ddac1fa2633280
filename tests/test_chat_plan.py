"""A chat request's messages take one path: the protocol's translation builds one ChatPlan (engine/chatplan.py),
the engine renders it once, and the prompt is what the template gives for the messages and tools in the model's
terms. Each protocol's form of the same conversation (a system message, a question, a call made after some
thinking, its result) gives the same prompt; no model is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from fakes import FakeModel

from localspec.engine.chatplan import ChatPlan, plan_chat
from localspec.engine.engine import Engine
from localspec.engine.template import render_chat
from localspec.engine.tools import plan_tools, template_context, tool_messages
from localspec.server.protocols.anthropic.convert import MessagesRequest
from localspec.server.protocols.anthropic.routes import prepare
from localspec.server.protocols.llamacpp import chat_request_prompt
from localspec.server.protocols.responses_request import ResponsesRequest, setup
from localspec.server.request import chat as chat_module
from localspec.server.request.chat import chat_prompt, ollama_plan, openai_plan
from localspec.server.request.schemas import OAIChatRequest, OllamaChatRequest

TEMPLATES = Path(__file__).parent / "templates"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": PARAMS}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ASKED = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
THOUGHT = "I should call the tool."
CONVERSATION = [*ASKED, {"role": "assistant", "content": "", "tool_calls": [CALL], "reasoning_content": THOUGHT},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]


class Target(FakeModel):
    """A model with no BOS or EOS whose tokens are the prompt's characters."""

    bos = eos = -1
    path = Path("fake.gguf")

    def metadata(self) -> dict[str, str]:
        return {}

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]


def engine(template: str) -> Engine:
    """An engine over a fake model with one of llama.cpp's copies of real templates (tests/templates/)."""
    return Engine(Target(lambda c: 1), name="fake", chat_template=(TEMPLATES / f"{template}.jinja").read_text())


def expected(e: Engine, messages: list[dict], tools: list[dict] | None = None, choice: Any = "auto") -> str:
    """The prompt as the engine's pieces give it: the tool plan, the messages in its terms, the template."""
    tpl = e.chat_template or ""
    p = plan_tools(tpl, tools, choice)
    return render_chat(tpl, tool_messages(messages, p, tpl), **template_context(p, tools))


def state(e: Engine) -> Any:
    return SimpleNamespace(engine=e, config=SimpleNamespace(reasoning_format="auto"))


def openai(e: Engine) -> str:
    req = OAIChatRequest.model_validate({"messages": CONVERSATION, "tools": [WEATHER]})
    return chat_prompt(e, openai_plan(e, req, "auto"))


def apply_template(e: Engine) -> str:
    req = OAIChatRequest.model_validate({"messages": CONVERSATION, "tools": [WEATHER]})
    return chat_request_prompt(state(e), req)


def ollama(e: Engine) -> str:
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    req = OllamaChatRequest.model_validate({"tools": [WEATHER], "messages": [
        *ASKED, {"role": "assistant", "content": "", "thinking": THOUGHT, "tool_calls": [call]},
        {"role": "tool", "tool_name": "get_weather", "content": "22 C"}]})
    return chat_prompt(e, ollama_plan(e, req, "auto"))


def anthropic(e: Engine) -> str:
    req = MessagesRequest.model_validate({
        "system": "Be brief.", "tools": [{"name": "get_weather", "description": "", "input_schema": PARAMS}],
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": THOUGHT, "signature": ""},
                         {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "call_1", "content": "22 C"}]}]})
    return prepare(state(e), req).prompt


def responses(e: Engine) -> str:
    """The Responses API leaves earlier reasoning out, so its conversation has no thinking."""
    req = ResponsesRequest.model_validate({
        "instructions": "Be brief.", "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
        "input": [{"role": "user", "content": "Weather in Paris?"},
                  {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                   "arguments": '{"city": "Paris"}'},
                  {"type": "function_call_output", "call_id": "call_1", "output": "22 C"}]})
    return setup(state(e), req)[1]


def history(protocol: str) -> list[dict]:
    """The conversation as the protocol can say it: the Responses API drops earlier reasoning, and Ollama's calls
    have no ids (the server numbers them; Mistral's template shows the ids)."""
    if protocol == "responses":
        return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in CONVERSATION]
    if protocol == "ollama":
        return json.loads(json.dumps(CONVERSATION).replace("call_1", "call_2_0"))
    return CONVERSATION


PROTOCOLS: dict[str, Callable[[Engine], str]] = {"openai": openai, "apply-template": apply_template,
                                                 "ollama": ollama, "anthropic": anthropic, "responses": responses}


@pytest.mark.parametrize("template", ["qwen3", "hermes-3", "mistral-nemo"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_protocol_builds_one_plan_and_the_engine_renders_it_once(monkeypatch, protocol: str, template: str):
    e = engine(template)
    plans: list[ChatPlan] = []
    rendered: list[ChatPlan] = []

    def build(*args: Any, **kwargs: Any) -> ChatPlan:
        plans.append(plan_chat(*args, **kwargs))
        return plans[-1]

    def render(plan: ChatPlan) -> str:
        rendered.append(plan)
        return Engine.render(e, plan)

    monkeypatch.setattr(chat_module, "plan_chat", build)
    monkeypatch.setattr(e, "render", render)
    prompt = PROTOCOLS[protocol](e)
    assert len(plans) == 1 and len(rendered) == 1
    assert plans[0].tools is not None and plans[0].tools.fmt != "generic"
    tools = [WEATHER] if protocol != "anthropic" else \
        [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS, "description": ""}}]
    assert prompt == expected(e, history(protocol), tools)
    assert "22 C" in prompt and "get_weather" in prompt


def test_the_reasoning_history_reaches_the_prompt_from_every_protocol_that_sends_it():
    e = engine("qwen3")
    for protocol in ("openai", "ollama", "anthropic"):
        assert f"<think>\n{THOUGHT}\n</think>" in PROTOCOLS[protocol](e), protocol


def test_a_trailing_assistant_message_is_a_prefill_the_answer_continues():
    e = engine("qwen3")
    msgs = [*ASKED, {"role": "assistant", "content": "It is"}]
    plan = openai_plan(e, OAIChatRequest.model_validate({"messages": msgs}), "auto")
    assert plan.prefill == "It is" and len(plan.messages) == 2 and plan.add_generation_prompt
    assert chat_prompt(e, plan) == render_chat(e.chat_template or "", ASKED) + "It is"
    finished = openai_plan(e, OAIChatRequest.model_validate({"messages": msgs, "continue_final_message": False}),
                           "auto")
    assert finished.prefill == "" and chat_prompt(e, finished) == render_chat(e.chat_template or "", msgs)


def test_a_template_without_tool_syntax_gets_the_tools_in_its_system_message_and_a_grammar():
    tpl = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}" \
          "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    e = Engine(Target(lambda c: 1), name="fake", chat_template=tpl)
    req = OAIChatRequest.model_validate({"messages": ASKED, "tools": [WEATHER], "tool_choice": "required"})
    plan = openai_plan(e, req, "auto")
    assert plan.tools is not None and plan.tools.fmt == "generic" and plan.grammar
    assert "tools" not in plan.context  # the generic format writes them into the system message instead
    prompt = chat_prompt(e, plan)
    assert prompt == expected(e, ASKED, [WEATHER], "required")
    assert prompt.startswith("<|system|>Be brief.\n\n") and "get_weather" in prompt
    assert not plan.reading(prompt).started


def test_the_reading_starts_inside_a_think_block_the_template_opened():
    e = engine("deepseek-r1-distill-qwen")
    plan = openai_plan(e, OAIChatRequest.model_validate({"messages": ASKED}), "auto")
    prompt = chat_prompt(e, plan)
    assert prompt.endswith("<think>\n") and plan.reading(prompt).started
    assert not openai_plan(e, OAIChatRequest.model_validate({"messages": ASKED, "reasoning_format": "none"}),
                           "auto").reading(prompt).started


def test_the_system_tokens_are_the_rendered_system_messages():
    """What a context shift keeps: the prompt's tokens up to the end of its system messages, tools included."""
    e = engine("qwen2.5")
    plan = openai_plan(e, OAIChatRequest.model_validate({"messages": ASKED, "tools": [WEATHER]}), "auto")
    tokens = e.tokenize(e.render(plan))
    head = e.render(plan.system_head() or plan)
    assert "get_weather" in head and "Weather in Paris?" not in head
    assert e.system_tokens(plan, tokens) == len(head)
    alone = openai_plan(e, OAIChatRequest.model_validate({"messages": ASKED[1:]}), "auto")
    assert alone.system_head() is None and e.system_tokens(alone, tokens) == 0


def test_plans_are_values():
    plan = plan_chat(None, ASKED, context={"enable_thinking": False})
    assert plan == ChatPlan(tuple(ASKED), {"enable_thinking": False})
    assert json.loads(json.dumps(list(plan.messages))) == ASKED
