"""An agent's turns keep one prefix: a system message sent mid-conversation (Claude Code's task notifications,
a Responses developer message) stays where it was sent, so each turn's prompt begins with the whole prompt of
the turn before, and the server's prompt cache reuses it. Templates that render a system message there keep it
in their own form; the others (Gemma's) get it as user text at the same place (template.fold_late_system).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localspec.engine.chatplan import plan_chat
from localspec.engine.template import fold_late_system, render_chat, supports_late_system
from localspec.server.protocols.anthropic.convert import (
    MessagesRequest,
    openai_messages,
    openai_tools,
)
from localspec.server.protocols.responses_request import ResponsesRequest, input_messages

TEMPLATES = Path(__file__).parent / "templates"
CAPTURES = Path(__file__).parent / "captures"


def test_fold_joins_a_late_system_message_to_the_user_text_around_it():
    u, a, s, r = ({"role": role, "content": text} for role, text in
                  (("user", "U"), ("assistant", "A"), ("system", "S"), ("user", "R")))
    head = {"role": "system", "content": "H"}
    assert fold_late_system([head, u, s]) == [head, {"role": "user", "content": "U\n\nS"}]
    assert fold_late_system([u, a, s, r]) == [u, a, {"role": "user", "content": "S\n\nR"}]
    assert fold_late_system([u, a, s]) == [u, a, {"role": "user", "content": "S"}]
    assert fold_late_system([u, s, r]) == [{"role": "user", "content": "U\n\nS\n\nR"}]  # turns still alternate
    assert fold_late_system([head, u, a]) == [head, u, a]  # a leading system message is the template's


@pytest.mark.parametrize("name,late", [("gemma-3", False), ("gemma-2", False), ("qwen2.5", True),
                                       ("llama-3.1", True), ("qwen3", True), ("mistral-nemo", False)])
def test_which_templates_render_a_late_system_message(name, late):
    assert supports_late_system((TEMPLATES / f"{name}.jinja").read_text()) is late


def claude_code_turns() -> list[dict[str, Any]]:
    """Claude Code's first request (captured; two tools kept), then the turns it sends after it: each adds the
    answer (a Bash call), its result, and on some turns a system-role notification after the result."""
    body = json.loads((CAPTURES / "claude_code_first.json").read_text())["body"]
    body["tools"] = [t for t in body["tools"] if t["name"] in ("Bash", "Read")]
    turns, msgs = [], list(body["messages"])
    for i in range(4):
        turns.append({**body, "messages": list(msgs)})
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"ls dir{i}"}}
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"Looking at dir{i}."}, call]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                  "content": f"file{i}.txt\nnotes{i}.md"}]})
        if i % 2 == 0:
            msgs.append({"role": "system", "content": f"<task-notification>task {i} finished</task-notification>"})
    return turns


def anthropic_prompt(template: str, body: dict[str, Any]) -> str:
    req = MessagesRequest.model_validate(body)
    plan = plan_chat(template, openai_messages(req), tools=openai_tools(req.tools))
    return render_chat(template, plan.messages, **plan.context)


@pytest.mark.parametrize("name", ["gemma-3", "qwen2.5", "llama-3.1"])
def test_each_claude_code_turn_begins_with_the_whole_turn_before(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    prompts = [anthropic_prompt(template, t) for t in claude_code_turns()]
    for before, after in zip(prompts, prompts[1:]):
        assert after.startswith(before), (name, before[-300:], after[len(before) - 300:len(before) + 100])
    assert "task 0 finished" in prompts[-1] and "task 2 finished" in prompts[-1]
    assert prompts[0].index("Available agent types") > prompts[0].index("List the files here")  # where it was sent


def test_leading_system_messages_still_open_the_prompt():
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "system": "Be brief.",
                                          "messages": [{"role": "system", "content": "Also kind."},
                                                       {"role": "user", "content": "Hi"},
                                                       {"role": "system", "content": "Later."}]})
    assert openai_messages(req) == [{"role": "system", "content": "Be brief.\n\nAlso kind."},
                                    {"role": "user", "content": "Hi"}, {"role": "system", "content": "Later."}]


def test_a_responses_developer_message_mid_conversation_stays_there():
    gemma = (TEMPLATES / "gemma-3.jinja").read_text()
    first = [{"type": "message", "role": "developer", "content": "Rules."},
             {"type": "message", "role": "user", "content": "List the files."}]
    later = [*first, {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
             {"type": "message", "role": "developer", "content": "Approval mode changed."}]
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    msgs = input_messages(ResponsesRequest(input=later))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "system"]
    a, b = (render_chat(gemma, (p := plan_chat(gemma, input_messages(ResponsesRequest(input=x)), tools=tools)).messages,
                        **p.context) for x in (first, later))
    assert b.startswith(a.removesuffix("<start_of_turn>model\n")) and "Approval mode changed." in b
