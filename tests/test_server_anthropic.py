"""Anthropic's Messages API against a real `localspec serve` (embedded SmolLM2, prompt lookup) with the real
`anthropic` client: text, system, multi-part content, stop_sequences, max_tokens, the stream's events and
block indices, count_tokens, a tool_use round trip, and errors in Anthropic's shape. The request conversion
and the stream's block bookkeeping are also checked as pure functions (fast tier).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from servers import ServerProcess

from localspec.engine.answer import AnswerDelta
from localspec.engine.tools import ToolCallDelta
from localspec.server.http import ApiError
from localspec.server.protocols.anthropic.convert import (
    CountTokensRequest,
    openai_messages,
    openai_tools,
    response_format,
    tool_choice,
)
from localspec.server.protocols.anthropic.stream import Blocks

HI = [{"role": "user", "content": "Write one short sentence about cats."}]
LONG = [{"role": "user", "content": "Write a long story about a dragon who learns to fly."}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
                            "required": ["location"]}}


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServerProcess]:
    with ServerProcess(["--ctx", "1024", "--threads", "2", "--lookup"]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)


def _ask(client: Any, messages: list[dict[str, Any]] = HI, **kw: Any) -> Any:
    """A greedy request; sampling fields go in the body as sent (newer clients dropped them from create())."""
    sampling = {"temperature": kw.pop("temperature", 0), **kw.pop("extra_body", {})}
    return client.messages.create(model="x", max_tokens=kw.pop("max_tokens", 8), messages=messages,
                                  extra_body=sampling, **kw)


# -- text -------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_text_message_shape_and_usage(client):
    r = _ask(client)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert 0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0
    assert r.usage.cache_read_input_tokens >= 0 and r.stop_sequence is None
    assert r.stop_reason == ("max_tokens" if r.usage.output_tokens == 8 else "end_turn")
    assert "timings" not in r.model_extra and r.model_extra["speculative"]["drafter"]  # ours, not llama-server's


@pytest.mark.slow
def test_max_tokens_ends_with_stop_reason_max_tokens(client):
    r = _ask(client, LONG, max_tokens=4)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 4


@pytest.mark.slow
def test_system_as_text_or_blocks_and_multipart_content_are_the_same_prompt(client):
    system = "You are a pirate. Answer like one."
    want = _ask(client, system=system).content[0].text
    blocks = [{"type": "text", "text": "You are a pirate."}, {"type": "text", "text": " Answer like one."}]
    assert _ask(client, system=blocks).content[0].text == want
    plain = _ask(client).content[0].text
    assert plain != want  # the system prompt counts
    parts = [{"role": "user", "content": [{"type": "text", "text": "Write one short sentence"},
                                          {"type": "text", "text": " about cats."}]}]
    assert _ask(client, parts).content[0].text == plain


@pytest.mark.slow
def test_stop_sequences_end_the_text_and_name_the_sequence(client):
    text = _ask(client, LONG, max_tokens=16).content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    r = _ask(client, LONG, max_tokens=16, stop_sequences=["\u2603never", stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[:text.index(stop)]


@pytest.mark.slow
def test_count_tokens_is_the_prompt_the_message_runs(client):
    brief = client.messages.count_tokens(model="x", messages=HI, system="Be brief.").input_tokens
    longer = client.messages.count_tokens(model="x", messages=HI, system="Be brief. Be kind.").input_tokens
    assert 0 < brief < longer
    with_tool = client.messages.count_tokens(model="x", messages=HI, system="Be brief.", tools=[WEATHER])
    assert with_tool.input_tokens > brief  # the tools are in the prompt
    r = _ask(client, system="Be brief.", max_tokens=1)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == brief


# -- streaming --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_stream_events_in_order_with_block_indices(client):
    whole = _ask(client, max_tokens=10)
    with client.messages.stream(model="x", max_tokens=10, messages=HI, extra_body={"temperature": 0}) as stream:
        events = [e for e in stream if e.type not in ("text",)]  # `text`: the client's own convenience event
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1:3] == ["content_block_start", "content_block_delta"] and kinds[-3] == "content_block_stop"
    assert {e.index for e in events if e.type.startswith("content_block")} == {0}
    assert events[0].message.usage.input_tokens > 0 and events[0].message.content == []
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == whole.content[0].text
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.slow
def test_raw_stream_names_every_event(server):
    body = {"model": "x", "max_tokens": 4, "stream": True, "messages": HI}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=120) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln[7:] for ln in lines if ln.startswith("event: ")]
    datas = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
    assert names == [d["type"] for d in datas] and names[1] == "ping"


# -- tools -------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_tool_use_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = _ask(client, ask, max_tokens=48, tools=[WEATHER], tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use", r.content
    call = next(b for b in r.content if b.type == "tool_use")
    assert call.id.startswith("toolu_") and call.name == "get_weather" and isinstance(call.input["location"], str)
    history = ask + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 25 C"},
                         {"type": "text", "text": "Answer in one sentence."}]}]
    after = _ask(client, history, max_tokens=8, tools=[WEATHER])
    assert after.content[0].type == "text"
    bad = _ask(client, history[:2] + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "is_error": True, "content": "City not found"}]}])
    assert bad.type == "message"


@pytest.mark.slow
def test_tool_use_streamed_as_input_json_deltas(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.messages.stream(model="x", max_tokens=48, messages=ask, extra_body={"temperature": 0},
                                tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.index for s in starts] == list(range(len(starts)))
    tool = next(s for s in starts if s.content_block.type == "tool_use")
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == tool.index]
    block = final.content[tool.index]
    assert block.type == "tool_use" and json.loads("".join(parts)) == block.input
    assert final.stop_reason == "tool_use" and tool.content_block.id.startswith("toolu_")


# -- errors ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kw, needle", [
    ({"extra_body": {"temperature": 3}}, "temperature"),
    ({"extra_body": {"top_k": -1}}, "top_k"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64",
      "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "image input is not supported"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "not in tools"),
])
def test_bad_requests_are_anthropic_errors(client, kw, needle):
    anthropic = pytest.importorskip("anthropic")
    with pytest.raises(anthropic.BadRequestError) as e:
        _ask(client, **kw)
    assert e.value.status_code == 400 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error" and needle in e.value.body["error"]["message"]


@pytest.mark.slow
def test_missing_messages_is_a_400_an_unknown_route_a_404_and_no_messages_an_answer(server):
    r = httpx.post(server.url + "/v1/messages", json={"model": "x", "max_tokens": 4}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "messages" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/messages/batches", json={}, timeout=60)
    assert r.status_code == 404 and r.json()["type"] == "error"
    r = httpx.post(server.url + "/v1/messages", json={"model": "x", "max_tokens": 1, "messages": []}, timeout=120)
    assert r.status_code == 200 and r.json()["type"] == "message"  # llama-server too accepts an empty list


# -- pure pieces -------------------------------------------------------------------------------------------------

def test_tool_use_and_results_become_openai_messages():
    req = CountTokensRequest(system=[{"type": "text", "text": "Be brief."}], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                                     {"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "Sunny"}]}]}])
    assert openai_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "user", "content": "Thanks"}]


def test_claude_codes_system_message_inside_messages_stays_where_it_was_sent():
    """Moved to the system prompt, it would change the prompt's start on every turn that adds one (the prompt
    cache lost); the template renders it there or template.fold_late_system joins it to the user text."""
    req = CountTokensRequest(system=[{"type": "text", "text": "You are Claude Code.",
                                      "cache_control": {"type": "ephemeral"}}],
                             messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                       {"role": "system", "content": "Agent types: ..."}])
    assert openai_messages(req) == [{"role": "system", "content": "You are Claude Code."},
                                    {"role": "user", "content": "hi"},
                                    {"role": "system", "content": "Agent types: ..."}]


def test_anthropic_tool_types_are_left_out_and_output_config_is_a_schema():
    tools = [{"name": "Bash", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
             {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
    assert openai_tools(tools) == [{"type": "function", "function": {
        "name": "Bash", "parameters": {"type": "object"}, "description": ""}}]
    assert openai_tools(tools[1:]) is None
    assert response_format(None) is None and response_format({"effort": "high"}) is None
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    assert response_format({"format": {"type": "json_schema", "schema": schema}}) == {
        "type": "json_schema", "json_schema": {"schema": schema}}
    with pytest.raises(ApiError):
        response_format({"format": {"type": "text"}})


def test_tool_choice_maps_to_openai():
    assert tool_choice(None) == ("auto", True)
    assert tool_choice({"type": "any", "disable_parallel_tool_use": True}) == ("required", False)
    assert tool_choice({"type": "tool", "name": "w"}) == ({"type": "function", "function": {"name": "w"}}, True)


def test_blocks_open_one_at_a_time_with_sequential_indices():
    b = Blocks()
    out = b.push(AnswerDelta(reasoning="Hmm.")) + b.push(AnswerDelta(content="Let me check."))
    out += b.push(AnswerDelta(calls=[ToolCallDelta(0, "", id="call_x", name="w")]))
    out += b.push(AnswerDelta(calls=[ToolCallDelta(0, '{"a": 1}'), ToolCallDelta(1, "{}", id="call_y", name="v")]))
    events = [json.loads(e.split("data: ", 1)[1]) for e in out + b.finish()]
    assert [(e["type"], e.get("index"), e.get("delta", {}).get("type")) for e in events] == [
        ("content_block_start", 0, None), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, None), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, None), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, None), ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None)]
    assert events[7]["content_block"] == {"type": "tool_use", "id": "toolu_x", "name": "w", "input": {}}
    empty = [json.loads(x.split("data: ", 1)[1]) for x in Blocks().finish()]
    assert [e["type"] for e in empty] == ["content_block_start", "content_block_stop"]  # no content: one text block
