"""Tool calls and reasoning on a real `localspec serve` (SmolLM2) with the real `openai` and `ollama` clients.

Two servers: one with SmolLM2's own template (no tool syntax: the generic, grammar-held JSON format) and one
started with `--chat-template-file` on a Qwen3-Thinking-style template (Hermes `<tool_call>` syntax, a generation
prompt that opens `<think>`). A required call's arguments parse and fit the tool's schema; streamed `tool_calls`
deltas come in OpenAI's shape and add up to the call; tool results go back through the template; `<think>` text
comes back as `reasoning_content` (OpenAI) and `thinking` (Ollama), or stays content under `--reasoning-format
none` as llama-server does it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import jsonschema
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 24}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "required": ["zone"],
                   "properties": {"zone": {"type": "string", "maxLength": 12}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
CALL = [{"role": "user", "content": "Call the get_weather tool with city Paris."}]
ARGS = ["--ctx", "2048", "--threads", "2", "--lookup", "--alias", "smol"]


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServerProcess]:
    with ServerProcess(ARGS) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def hermes(smollm2_path) -> Iterator[ServerProcess]:
    with ServerProcess([*ARGS, "--chat-template-file", str(TEMPLATES / "qwen3-thinking.jinja")]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


def openai_client(srv: ServerProcess) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def fits(name: str, arguments: str | dict) -> None:
    (fn,) = [t["function"] for t in (WEATHER, TIME) if t["function"]["name"] == name]
    jsonschema.validate(json.loads(arguments) if isinstance(arguments, str) else arguments, fn["parameters"])


@pytest.mark.parametrize("which", ["server", "hermes"])
def test_a_required_call_with_the_openai_client(request, which: str) -> None:
    client = openai_client(request.getfixturevalue(which))
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=64, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content in (None, "")
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.id
    fits(call.function.name, call.function.arguments)


def test_streamed_tool_call_deltas_add_up(hermes: ServerProcess) -> None:
    client = openai_client(hermes)
    chunks = list(client.chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0,
        stream=True, parallel_tool_calls=False))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or []) if ch.choices]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert rest and all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    fits("get_weather", "".join(d.function.arguments for d in rest))
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_a_named_function_is_called(server: ServerProcess) -> None:
    r = openai_client(server).chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER, TIME], max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time"
    fits("get_time", call.function.arguments)


@pytest.mark.parametrize("which", ["server", "hermes"])
def test_tool_results_go_back_through_the_template(request, which: str) -> None:
    """The assistant's call and the tool's result, sent back: the prompt holds both, the answer is text."""
    srv = request.getfixturevalue(which)
    msgs = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 22 degrees"}]
    client = openai_client(srv)
    r = client.chat.completions.create(model="x", messages=msgs, tools=[WEATHER], tool_choice="none", max_tokens=4,
                                       temperature=0)
    asked = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], tool_choice="none",
                                           max_tokens=4, temperature=0)
    m = r.choices[0].message
    assert (m.content or (m.model_extra or {}).get("reasoning_content")) and not m.tool_calls
    assert r.usage.prompt_tokens > asked.usage.prompt_tokens + 4  # the call and its result are in the prompt


def test_bad_tool_choice_is_a_400(server: ServerProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_legacy_functions(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as http:
        body = http.post("/v1/chat/completions", json={
            "messages": ASK, "functions": [WEATHER["function"]], "function_call": {"name": "get_weather"},
            "max_tokens": 64, "temperature": 0}).json()
    c = body["choices"][0]
    assert c["finish_reason"] == "function_call" and "tool_calls" not in c["message"]
    assert c["message"]["function_call"]["name"] == "get_weather"
    fits("get_weather", c["message"]["function_call"]["arguments"])


def test_think_block_becomes_reasoning_content(server: ServerProcess) -> None:
    """A grammar makes SmolLM2 write a think block; `--reasoning-format auto` moves it to `reasoning_content`,
    `none` (per request, as llama-server takes it) leaves it in the content."""
    grammar = 'root ::= "<think>" [a-z ]{3,20} "</think>" [A-Za-z ]{1,20}'
    client = openai_client(server)
    r = client.chat.completions.create(model="x", messages=ASK, max_tokens=48, temperature=0,
                                       extra_body={"grammar": grammar})
    m = r.choices[0].message
    reasoning = (m.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in (m.content or "") and m.content
    kept = client.chat.completions.create(model="x", messages=ASK, max_tokens=48, temperature=0,
                                          extra_body={"grammar": grammar, "reasoning_format": "none"})
    # each answer's own text, not the first one's: two greedy runs may part on a near tie (the prompt cache and
    # the verify batches change the float sums), and the point here is where the think block goes
    assert re.fullmatch(r"<think>[a-z ]{3,20}</think>[A-Za-z ]{1,20}", kept.choices[0].message.content or "")
    assert not (kept.choices[0].message.model_extra or {}).get("reasoning_content")
    chunks = list(client.chat.completions.create(model="x", messages=ASK, max_tokens=48, temperature=0,
                                                 stream=True, extra_body={"grammar": grammar}))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert re.fullmatch(r"[a-z ]{3,20}", streamed) and content and "<think>" not in content
    assert "".join(d.content or "" for d in deltas) == m.content


def test_a_template_that_opens_thinking(hermes: ServerProcess) -> None:
    """The template's generation prompt opens `<think>`: the answer starts as reasoning; `enable_thinking`
    false (llama-server's chat_template_kwargs) closes the block in the prompt, and the answer is content."""
    client = openai_client(hermes)
    r = client.chat.completions.create(model="x", messages=ASK, max_tokens=8, temperature=0)
    assert (r.choices[0].message.model_extra or {}).get("reasoning_content")
    off = client.chat.completions.create(model="x", messages=ASK, max_tokens=8, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content and not (off.choices[0].message.model_extra or {}).get("reasoning_content")


# -- Ollama ---------------------------------------------------------------------------------------------------------

def ollama_client(srv: ServerProcess) -> Any:
    ollama = pytest.importorskip("ollama")
    return ollama.Client(host=srv.url)


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_tool_calls(server: ServerProcess, stream: bool) -> None:
    """Ollama has no tool_choice: the model decides (here, on the generic format, SmolLM2 calls). The call comes
    back in Ollama's shape, its arguments an object; streamed, in an object of its own before the last."""
    kw: dict[str, Any] = dict(model="smol", messages=CALL, tools=[WEATHER],
                              options={"temperature": 0, "num_predict": 48})
    client = ollama_client(server)
    if stream:
        parts = list(client.chat(stream=True, **kw))
        calls = [c for p in parts for c in (p.message.tool_calls or [])]
        assert parts[-1].done and not parts[-1].message.tool_calls
    else:
        r = client.chat(**kw)
        calls = list(r.message.tool_calls or [])
        assert r.message.content == ""
    assert [c.function.name for c in calls] == ["get_weather"]
    assert isinstance(calls[0].function.arguments, dict)
    fits("get_weather", calls[0].function.arguments)


def test_ollama_tool_results_and_thinking(hermes: ServerProcess) -> None:
    client = ollama_client(hermes)
    msgs = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 22 degrees"}]
    opts = {"temperature": 0, "num_predict": 8}
    r = client.chat(model="smol", messages=msgs, tools=[WEATHER], think=True, options=opts)
    assert r.message.thinking and not r.message.content  # the template opened the block: SmolLM2 is thinking
    off = client.chat(model="smol", messages=msgs, think=False, options=opts)
    assert off.message.content and not off.message.thinking
