"""OpenAI's Responses API against a real `localspec serve` (embedded SmolLM2, prompt lookup) with the real `openai`
client: `client.responses.create` whole and streamed (the event sequence, ids, the text the deltas add up to),
instructions and message lists, the budget's `incomplete` status, `text.format`, function tools (calls whole and
streamed in OpenAI's event order, and a second turn with the call, its output and a reasoning item), and bad
requests. The input conversion is also checked as a pure function (fast tier).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from servers import ServerProcess

from localspec.server.http import ApiError
from localspec.server.protocols.responses_request import (
    ResponsesRequest,
    chat_choice,
    function_tools,
    input_messages,
    response_format,
)

ASK = "Write one short sentence about cats."
LONG = "Write a long story about a dragon who learns to fly."
STREAM_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                 "response.content_part.added"]
CLOSING_EVENTS = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServerProcess]:
    with ServerProcess(["--ctx", "1024", "--threads", "2", "--lookup"]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _create(client: Any, input: Any = ASK, **kw: Any) -> Any:
    return client.responses.create(model="x", input=input, max_output_tokens=kw.pop("max_output_tokens", 8),
                                   temperature=kw.pop("temperature", 0), **kw)


@pytest.mark.slow
def test_create_returns_one_message_with_ids_and_usage(client):
    r = _create(client)
    assert r.id.startswith("resp_") and r.object == "response"
    assert [o.type for o in r.output] == ["message"] and r.output[0].id.startswith("msg_")
    assert r.output[0].content[0].type == "output_text" and r.output_text == r.output[0].content[0].text != ""
    assert 0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if r.usage.output_tokens == 8 else "completed")
    assert r.model_extra["speculative"]["drafter"] and "predicted_n" in r.model_extra["timings"]


@pytest.mark.slow
def test_a_budget_that_runs_out_is_incomplete(client):
    r = _create(client, LONG, max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4 and r.output_text


@pytest.mark.slow
def test_instructions_are_the_system_message_and_parts_join(client):
    system = "You are a pirate. Answer like one."
    want = _create(client, [{"role": "system", "content": system}, {"role": "user", "content": ASK}]).output_text
    assert _create(client, instructions=system).output_text == want
    assert _create(client, [{"role": "developer", "content": system}, {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Write one short sentence"},
                               {"type": "input_text", "text": " about cats."}]}]).output_text == want
    assert want != _create(client).output_text  # the instructions count


@pytest.mark.slow
def test_stream_events_in_order_and_deltas_add_up(client):
    whole = _create(client, max_output_tokens=10)
    events = list(_create(client, max_output_tokens=10, stream=True))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == STREAM_EVENTS + ["response.output_text.delta"] * len(deltas) + CLOSING_EVENTS + [kinds[-1]]
    assert kinds[-1] == ("response.completed" if whole.status == "completed" else "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    resp_id, msg_id = events[0].response.id, events[2].item.id
    assert resp_id.startswith("resp_") and msg_id.startswith("msg_")
    assert all(e.item_id == msg_id for e in events[3:-2]) and events[-2].item.id == msg_id
    final = events[-1].response
    assert final.id == resp_id and "".join(e.delta for e in deltas) == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.slow
def test_text_format_json_schema_constrains_the_output(client):
    r = _create(client, "Write an example", max_output_tokens=10,
                text={"format": {"type": "json_schema", "name": "test", "schema": {"const": "foooooo"}}})
    assert r.output_text == '"foooooo"'
    obj = _create(client, "Write an example", max_output_tokens=24, text={"format": {"type": "json_object"}})
    assert obj.output_text.lstrip().startswith("{")


@pytest.mark.slow
@pytest.mark.parametrize("kw, needle", [
    ({"text": {"format": {"type": "json_schema", "name": "test"}}}, "schema"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input_image"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
    ({"temperature": 5}, "temperature"),
])
def test_bad_requests_are_400s(client, kw, needle):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, **kw)
    assert needle in e.value.body["message"]


WEATHER = {"type": "function", "name": "get_weather", "description": "Get the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 524288}},
                          "required": ["city"]}}
CALL_EVENTS = ["response.created", "response.in_progress", "response.output_item.added"]
CALL_CLOSING = ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]


@pytest.mark.slow
def test_a_required_call_is_a_function_call_item_whole_and_streamed(client):
    kw = {"tools": [WEATHER, {"type": "web_search"}], "tool_choice": "required", "parallel_tool_calls": False,
          "max_output_tokens": 40}
    r = _create(client, "What is the weather in Paris?", **kw)
    assert [o.type for o in r.output] == ["function_call"] and r.status == "completed"
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert r.tool_choice == "required" and r.parallel_tool_calls is False
    events = list(_create(client, "What is the weather in Paris?", stream=True, **kw))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert kinds == CALL_EVENTS + ["response.function_call_arguments.delta"] * len(deltas) + CALL_CLOSING
    assert events[2].item.type == "function_call" and events[2].item.arguments == ""
    done = events[-2].item
    assert "".join(d.delta for d in deltas) == events[-3].arguments == done.arguments == call.arguments
    assert done.call_id == events[2].item.call_id and events[-1].response.output[0].call_id == done.call_id
    named = _create(client, "Hi", **{**kw, "tool_choice": {"type": "function", "name": "get_weather"}})
    assert named.output[0].type == "function_call"


@pytest.mark.slow
def test_a_second_turn_reads_the_call_its_output_and_reasoning(client):
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 25 C"}]
    r = _create(client, history, tools=[WEATHER], tool_choice="none", max_output_tokens=12)
    assert [o.type for o in r.output] == ["message"] and r.output_text


@pytest.mark.slow
def test_llama_server_path_and_raw_event_names(server):
    body = {"input": ASK, "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/responses", json=body, timeout=120) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln[7:] for ln in lines if ln.startswith("event: ")]
    assert names == [json.loads(ln[6:])["type"] for ln in lines if ln.startswith("data: ")]
    assert names[:4] == STREAM_EVENTS


@pytest.mark.slow
def test_a_stream_with_llama_servers_progress_and_timings(server):
    """llama-server's test_responses_stream_with_llama_telemetry: `response.in_progress` events carry the prompt's
    progress (its cached part, then all of it), each round's last event its `timings`, the last event too."""
    body = {"input": "This is a test" * 10, "max_output_tokens": 8, "temperature": 0.8, "stream": True,
            "timings_per_token": True, "return_progress": True}
    with httpx.stream("POST", server.url + "/responses", json=body, timeout=120) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert {e["type"] for e in events if "prompt_progress" in e} == {"response.in_progress"}
    assert progress[0]["processed"] == progress[0]["cache"] and len(progress) >= 2
    assert all(a["processed"] < b["processed"] and a["total"] == b["total"] for a, b in zip(progress, progress[1:]))
    assert progress[-1]["processed"] == progress[-1]["total"] > 0
    assert any(e["type"] == "response.output_text.delta" and "predicted_per_second" in e.get("timings", {})
               for e in events)
    last = events[-1]  # sampled at 0.8, the answer may end before its budget: OpenAI names each end apart
    ran_out = last["response"]["usage"]["output_tokens"] >= 8
    assert last["type"] == ("response.incomplete" if ran_out else "response.completed")  # llama-server: completed
    assert "usage" in last["response"] and "prompt_per_second" in last["timings"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    long = {**body, "input": "This is a test. " * 150}  # past one batch of 512 tokens
    with httpx.stream("POST", server.url + "/responses", json=long, timeout=120) as r:
        marks = [json.loads(ln[6:]).get("prompt_progress") for ln in r.iter_lines() if ln.startswith("data: ")]
    done = [m["processed"] - m["cache"] for m in marks if m]
    assert done[0] == 0 and 512 in done and done[-1] > 512  # the cached part, a batch, the rest
    plain = {"input": ASK, "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/responses", json=plain, timeout=120) as r:
        quiet = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert not any("prompt_progress" in e or "timings" in e for e in quiet[:-1])


def test_input_forms_become_chat_messages():
    assert input_messages(ResponsesRequest(input="hi", instructions="sys")) == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    req = ResponsesRequest(input=[{"role": "developer", "content": "d"},
                                  {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]}])
    assert input_messages(req) == [{"role": "system", "content": "d"}, {"role": "assistant", "content": "a"}]


def test_calls_results_and_reasoning_items_become_chat_messages():
    """Codex's later turns: function_call items join one assistant message, outputs are tool messages, reasoning
    items are left out, the developer messages before the first other item join the one system message
    first, and a later one stays where it was sent (the turn before's prompt stays this one's prefix)."""
    req = ResponsesRequest(instructions="i", input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec", "arguments": '{"cmd":"ls"}'},
        {"type": "function_call", "call_id": "call_2", "name": "exec", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "developer", "content": "later"}])
    assert input_messages(req) == [
        {"role": "system", "content": "i\n\nd"}, {"role": "user", "content": "ls"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "exec", "arguments": '{"cmd":"ls"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "exec", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"}, {"role": "system", "content": "later"}]


def test_tools_this_server_cannot_run_are_left_out_and_choices_map():
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False},
             {"type": "web_search", "external_web_access": False},
             {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]}]
    assert function_tools(tools) == [{"type": "function", "function": {
        "name": "f", "description": "", "parameters": {"type": "object"}}}]
    assert function_tools(tools[1:]) is None
    assert [chat_choice(c) for c in (None, "auto", "none", "required")] == ["auto", "auto", "none", "required"]
    assert chat_choice({"type": "function", "name": "f"}) == {"type": "function", "function": {"name": "f"}}
    assert chat_choice({"type": "web_search"}) == "auto"


def test_text_format_in_response_format_shape():
    assert response_format(None) is None and response_format({"format": {"type": "text"}}) == {"type": "text"}
    assert response_format({"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}) == {
        "type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    with pytest.raises(ApiError):
        response_format({"format": {"type": "json_schema", "name": "n"}})
