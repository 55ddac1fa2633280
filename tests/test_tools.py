"""Tool calls on real chat templates (tests/templates/: llama.cpp's copies of Qwen 2.5, Qwen 3, Hermes 3,
Llama 3.1 and Mistral Nemo, and a small FunctionGemma one): which format each template writes, each format's real
output read back as content plus calls, whole and streamed a character at a time (the streamed pieces add up to
the whole parse), and tool calls and results rendered back through the template.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.engine.template import ChatTemplateError, render_chat
from localspec.engine.toolgrammar import tool_grammar
from localspec.engine.tools import (
    ToolCallStream,
    ToolChoiceError,
    ToolPlan,
    detect_tool_format,
    plan_tools,
    template_context,
    tool_messages,
)

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.mark.parametrize("name, fmt", [("qwen2.5", "hermes"), ("qwen3", "hermes"), ("hermes-3", "hermes"),
                                       ("llama-3.1", "llama3"), ("mistral-nemo", "mistral"),
                                       ("functiongemma", "gemma")])
def test_detects_the_format_a_template_writes(name: str, fmt: str) -> None:
    assert detect_tool_format(template(name)) == fmt


def test_a_template_without_tool_syntax_is_generic() -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert detect_tool_format(chatml) == detect_tool_format(None) == "generic"


# Each format's output as the model writes it (llama.cpp's tests/test-chat.cpp uses the same shapes)
OUTPUTS = {
    "hermes": ('I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
               "I will look.\n", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    "llama3": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris, \\"FR\\""}}', "",
               [("get_weather", {"city": 'Paris, "FR"'})]),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}, '
                '{"name": "get_time", "arguments": {}, "id": "abcDEF124"}]', "",
                [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    "gemma": ("<start_function_call>call:get_weather{city:<escape>Paris, FR<escape>,days:3}<end_function_call>", "",
              [("get_weather", {"city": "Paris, FR", "days": 3})]),
    "generic": ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', "",
                [("get_weather", {"city": "Paris"})]),
}
OUTPUTS["generic-response"] = ('{"response": "It is \\"sunny\\", \\u00e9t\\u00e9"}', 'It is "sunny", été', [])
OUTPUTS["mistral-args"] = ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "",
                           [("get_weather", {"city": "Paris"})])


def plan(fmt: str, *, parallel: bool = True) -> ToolPlan:
    return ToolPlan(fmt.split("-")[0], [WEATHER["function"], TIME["function"]], False, parallel, None)


def streamed(p: ToolPlan, text: str) -> tuple[str, dict[int, dict], ToolCallStream]:
    """Push text a character at a time; the content pieces joined and each call's pieces joined."""
    s = p.stream()
    content, calls = "", {}
    for piece in [*text, None]:
        c, deltas = s.push(piece) if piece is not None else s.finish()
        content += c
        for d in deltas:
            if d.id is not None:
                assert d.index not in calls, "a call is announced once"
                calls[d.index] = {"id": d.id, "name": d.name, "arguments": ""}
            calls[d.index]["arguments"] += d.arguments
    return content, calls, s


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_parses_each_formats_output(fmt: str) -> None:
    text, content, expected = OUTPUTS[fmt]
    got_content, calls = plan(fmt).parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_streamed_pieces_add_up_to_the_whole_parse(fmt: str) -> None:
    text, content, expected = OUTPUTS[fmt]
    got_content, calls, s = streamed(plan(fmt), text)
    assert got_content == content
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == expected
    assert [(c.id, c.name, c.arguments) for c in s.calls] == [
        (calls[i]["id"], calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]


def test_first_streamed_delta_is_openais_announcement() -> None:
    """OpenAI's first delta of a call: index, id, type, function.name and empty arguments; then argument text."""
    s = plan("hermes").stream()
    deltas = [d for ch in OUTPUTS["hermes"][0] for d in s.push(ch)[1]]
    first = deltas[0].openai()
    assert first == {"index": 0, "id": first["id"], "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}
    assert first["id"].startswith("call_")
    assert all(set(d.openai()) == {"index", "function"} for d in deltas[1:] if d.id is None)
    assert len([d for d in deltas if d.arguments]) > 3  # the arguments arrive in pieces, as generated


def test_content_is_held_while_it_may_become_a_marker() -> None:
    s = plan("hermes").stream()
    assert s.push("Sure <tool_c") == ("Sure ", [])
    assert s.push("all>")[0] == ""


@pytest.mark.parametrize("fmt, text", [("hermes", "<tool_call>\nnot json\n</tool_call>"),
                                       ("llama3", "{not a call"), ("generic", "plain words")])
def test_a_call_that_does_not_parse_stays_content(fmt: str, text: str) -> None:
    assert plan(fmt).parse(text) == (text, [])
    content, calls, _ = streamed(plan(fmt), text)
    assert content == text and calls == {}


def test_a_call_cut_short_is_dropped() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    content, calls, s = streamed(plan("hermes"), text)
    assert s.calls == [] and plan("hermes").parse(text)[1] == []


def test_one_call_without_parallel_tool_calls() -> None:
    text = OUTPUTS["hermes"][0]
    assert [c.name for c in plan("hermes", parallel=False).parse(text)[1]] == ["get_weather"]
    _, calls, s = streamed(plan("hermes", parallel=False), text)
    assert list(calls) == [0] and [c.name for c in s.calls] == ["get_weather"]


def test_mistral_ids_are_nine_letters_and_digits() -> None:
    (call,) = plan("mistral").parse(OUTPUTS["mistral-args"][0])[1]
    assert len(call.id) == 9 and call.id.isalnum()


def test_tool_choice() -> None:
    assert plan_tools(None, [WEATHER], "none") is None and plan_tools(None, [], "auto") is None
    named = plan_tools(template("qwen2.5"), [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert named is not None and named.required and [f["name"] for f in named.functions] == ["get_time"]
    auto = plan_tools(template("qwen2.5"), [WEATHER, TIME], "auto")
    assert auto is not None and auto.grammar is None and not auto.required  # a native format under auto is free
    with pytest.raises(ToolChoiceError):
        plan_tools(None, [WEATHER], {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ToolChoiceError):
        plan_tools(None, [WEATHER], "sometimes")


def conversation(call_id: str = "call_1") -> list[dict]:
    """A user question, the assistant's call (OpenAI's shape: arguments as JSON text) and the tool's result."""
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "22 C and sunny"}]


def render(name: str, messages: list[dict], tools: list[dict]) -> str:
    tpl = template(name)
    p = plan_tools(tpl, tools, "auto")
    return render_chat(tpl, tool_messages(messages, p, tpl), bos="<s>", eos="</s>", **template_context(p, tools))


@pytest.mark.parametrize("name, call, result", [
    ("qwen2.5", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "<tool_response>\n22 C and sunny\n</tool_response>"),
    ("qwen3", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "<tool_response>\n22 C and sunny\n</tool_response>"),
    ("llama-3.1", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     "<|start_header_id|>ipython<|end_header_id|>\n\n\"22 C and sunny\""),
    ("functiongemma", "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
     "<start_function_response>response:get_weather{value:<escape>22 C and sunny<escape>}"),
])
def test_tool_calls_and_results_render_through_the_template(name: str, call: str, result: str) -> None:
    text = render(name, conversation(), [WEATHER])
    assert call in text and result in text
    assert "get_weather" in text.split(call)[0]  # the tool's declaration, before the conversation


def test_mistral_renders_calls_and_results_with_its_nine_character_ids() -> None:
    """Mistral's template refuses ids that are not 9 characters: OpenAI-style ids are mapped, the same id to the
    same one, so the call and its result still match."""
    text = render("mistral-nemo", conversation("call_abcdefghijklmnopqrstuvwx"), [WEATHER])
    assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "' in text
    ids = [part.split('"')[0] for part in text.split('"id": "')[1:]]
    assert "[AVAILABLE_TOOLS]" in text and "[TOOL_RESULTS]" in text and '"content": 22 C and sunny' in text
    assert len(ids[0]) == 9 and ids[0].isalnum() and f'"call_id": "{ids[0]}"' in text


def test_generic_format_puts_tools_and_results_in_the_messages() -> None:
    """A template without tool syntax: the tools and the answer's shape go into the system message; calls and
    results become JSON text the template renders as plain turns."""
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    p = plan_tools(chatml, [WEATHER], "required")
    assert p is not None and p.fmt == "generic" and p.grammar
    msgs = tool_messages(conversation(), p, chatml)
    assert msgs[0]["role"] == "system" and '"get_weather"' in msgs[0]["content"]
    assert "{\"response\"" not in msgs[0]["content"]  # required: answering without a call is not offered
    assert json.loads(msgs[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    assert json.loads(msgs[3]["content"]) == {"tool_response": {"tool": "get_weather", "content": "22 C and sunny"}}
    assert "22 C and sunny" in render_chat(chatml, msgs)


def test_a_template_error_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError):
        render_chat(template("mistral-nemo"), [{"role": "assistant", "content": "hi"},
                                               {"role": "assistant", "content": "again"}])


def test_without_tools_a_plain_history_is_left_as_it_is() -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert tool_messages(history, None, chatml) == history


def test_arguments_that_are_not_json_leave_the_call_as_content() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    assert plan("hermes").parse(text) == (text, [])


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "llama3"])
def test_without_parallel_calls_the_grammar_allows_one_call(fmt: str) -> None:
    """A required call under parallel_tool_calls=false: the grammar ends after one call, so generation stops
    there instead of running to max_tokens."""
    fns = [WEATHER["function"]]
    one = tool_grammar(fmt, fns, required=True, parallel=False) or ""
    assert one.splitlines()[0].count("tool-call") == 1
    many = tool_grammar(fmt, fns, required=True, parallel=True) or ""
    assert fmt == "llama3" or "*" in many.splitlines()[0]


def test_generic_format_joins_parallel_results_into_one_user_turn() -> None:
    """Three calls at once (as Codex makes them) and their three results: the results are one user turn, so a
    template that wants turns to alternate (Gemma's) renders the conversation."""
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": json.dumps({"city": c})}}
             for i, c in enumerate(["Paris", "Rome", "Oslo"])]
    results = [{"role": "tool", "tool_call_id": f"call_{i}", "content": f"{i} C"} for i in range(3)]
    history = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": calls},
               *results, {"role": "assistant", "content": "Cold."}, {"role": "user", "content": "Thanks"}]
    msgs = tool_messages(history, plan_tools(template("gemma-2"), [WEATHER]), template("gemma-2"))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    lines = [json.loads(line)["tool_response"] for line in msgs[3]["content"].splitlines()]
    assert lines == [{"tool": "get_weather", "content": f"{i} C"} for i in range(3)]
    assert '"content": "2 C"' in render_chat(template("gemma-2"), msgs[1:])
    then = tool_messages([*history[:3], {"role": "user", "content": "And Rome?"}], None, template("gemma-2"))
    assert [m["role"] for m in then] == ["user", "assistant", "user"]  # a message after a result joins it
    assert then[2]["content"].endswith('"0 C"}}\nAnd Rome?')
