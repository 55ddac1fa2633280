"""The chat routes' tool and reasoning shapes, without a model: OpenAI's message, deltas and finish reasons
(legacy `function_call` too), Ollama's calls and chat history, and the 400s for malformed tools."""

from __future__ import annotations

import json

import pytest

from localspec.engine.answer import Answer, AnswerDelta
from localspec.engine.tools import ToolCall, ToolCallDelta
from localspec.server.http import ApiError
from localspec.server.request.chat_tools import (
    check_tools,
    legacy_tools,
    ollama_calls,
    ollama_message,
    ollama_messages,
    openai_delta,
    openai_finish,
    openai_message,
    reasoning_format,
)

CALL = ToolCall("get_weather", '{"city": "Paris"}', "call_abc")


def test_openai_message_with_calls_and_reasoning() -> None:
    m = openai_message(Answer("Thinking it over.", "", [CALL]))
    assert m == {"role": "assistant", "content": None, "reasoning_content": "Thinking it over.",
                 "tool_calls": [{"id": "call_abc", "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert openai_message(Answer("", "Hi", [])) == {"role": "assistant", "content": "Hi"}
    legacy = openai_message(Answer("", "", [CALL]), legacy=True)
    assert legacy["function_call"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert "tool_calls" not in legacy


def test_openai_deltas() -> None:
    first, more = ToolCallDelta(0, "", id="call_abc", name="get_weather"), ToolCallDelta(0, '{"city"')
    assert openai_delta(AnswerDelta("hm", "", [first])) == {
        "reasoning_content": "hm",
        "tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}}]}
    assert openai_delta(AnswerDelta(calls=[more])) == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}
    assert openai_delta(AnswerDelta(calls=[first]), legacy=True) == {
        "function_call": {"name": "get_weather", "arguments": ""}}
    assert openai_delta(AnswerDelta(calls=[more]), legacy=True) == {"function_call": {"arguments": '{"city"'}}
    assert openai_delta(AnswerDelta()) == {}


def test_finish_reasons() -> None:
    assert openai_finish("stop", [CALL]) == "tool_calls"
    assert openai_finish("stop", [CALL], legacy=True) == "function_call"
    assert openai_finish("length", [CALL]) == "length"  # cut short, as llama-server reports it
    assert openai_finish("stop", []) == "stop"


def test_ollama_shapes() -> None:
    assert ollama_calls([CALL]) == [{"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    m = ollama_message(Answer("hm", "", [CALL]), think=None)
    assert m["thinking"] == "hm" and m["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert "thinking" not in ollama_message(Answer("hm", "Hi", []), think=False)


def test_ollama_history_pairs_results_with_calls() -> None:
    """Ollama's calls have no ids: each result takes the id of the next unanswered call of its tool."""
    msgs = ollama_messages([
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "tool_name": "get_time", "content": "noon"},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"}])
    ids = [c["id"] for c in msgs[1]["tool_calls"]]
    assert len(set(ids)) == 2
    assert (msgs[2]["tool_call_id"], msgs[2]["name"]) == (ids[1], "get_time")
    assert (msgs[3]["tool_call_id"], msgs[3]["name"]) == (ids[0], "get_weather")
    assert json.loads(json.dumps(msgs))  # plain data the template can read


@pytest.mark.parametrize("tools", [[{"type": "function"}], [{"type": "code", "function": {"name": "x"}}],
                                   [{"type": "function", "function": {"name": "x", "parameters": "text"}}], ["x"]])
def test_malformed_tools_are_a_400(tools: list) -> None:
    with pytest.raises(ApiError) as e:
        check_tools(tools)
    assert e.value.status == 400


def test_legacy_functions_become_tools() -> None:
    fn = {"name": "get_weather", "parameters": {"type": "object"}}
    assert legacy_tools([fn], {"name": "get_weather"}) == (
        [{"type": "function", "function": fn}], {"type": "function", "function": {"name": "get_weather"}})
    assert legacy_tools(None, None) == (None, None)


def test_reasoning_format() -> None:
    assert reasoning_format(None, "auto") == "auto" and reasoning_format("none", "auto") == "none"
    with pytest.raises(ApiError):
        reasoning_format("sometimes", "auto")
