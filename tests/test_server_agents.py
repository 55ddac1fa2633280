"""What Claude Code 2.1 and Codex CLI 0.171 send, replayed against a real `localspec serve`. The
captures (tests/captures/, long texts cut) came from the real clients through a recording server:

- Claude Code's first request: a streamed `POST /v1/messages?beta=true` with 25 tools (`Workflow` has a
  `maxLength: 524288` string, which crashed the server, and an annotation-only `args`), a system-role message
  inside `messages`, `thinking`, `context_management`, `output_config`, `cache_control` and `metadata`; its
  session-title request constrains the answer with `output_config.format`'s JSON schema.
- Codex's first request: a streamed `POST /v1/responses` with function tools, a `namespace` of tools,
  `web_search`, developer messages, `reasoning`, `include`, `store: false` and `prompt_cache_key`.
- A later Codex turn on Gemma-3-270M (scripts/clients/real_clients.py --codex-lean --save): three calls made at once and
  their three results, then a call, the text the model wrote beside it, and its result. Gemma's template refuses
  two turns of one role in a row, and this request got a 400 for it twice.

Whole, Claude Code's first request is longer than this server's context: the answer is the context error in
Anthropic's shape, after everything else was accepted. Codex's runs whole (with a budget of 8 tokens), and both
cut to a few tools run streamed to the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from servers import ServerProcess

from localspec.engine.chatplan import plan_chat
from localspec.engine.template import render_chat
from localspec.server.protocols.responses_request import ResponsesRequest, chat_choice, function_tools, input_messages

pytestmark = pytest.mark.slow

CAPTURES = Path(__file__).parent / "captures"
GEMMA = Path(__file__).parent / "templates" / "gemma-2.jinja"


def _capture(name: str) -> tuple[str, dict[str, Any]]:
    c = json.loads((CAPTURES / f"{name}.json").read_text())
    return c["path"], c["body"]


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServerProcess]:
    with ServerProcess(["--ctx", "2048", "--threads", "2"]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


@pytest.fixture(scope="module")
def gemma_server(smollm2_path) -> Iterator[ServerProcess]:
    """A server whose chat template wants user and assistant turns in turn, as Gemma's does."""
    with ServerProcess(["--ctx", "2048", "--threads", "2", "--chat-template-file", str(GEMMA)]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


def _events(url: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The stream's `data:` events (or the error body as the one event)."""
    with httpx.stream("POST", url, json=body, timeout=600) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(r.read())]
        return 200, [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]


def test_claude_code_first_request_is_accepted_and_told_it_does_not_fit(server):
    path, body = _capture("claude_code_first")
    status, events = _events(server.url + path, body)
    assert status == 400 and events[0]["type"] == "error", events
    assert "exceeds the available context size" in events[0]["error"]["message"]


def test_claude_code_request_with_its_hardest_tools_streams_to_the_end(server):
    path, body = _capture("claude_code_first")
    body = {**body, "max_tokens": 16, "tools": [t for t in body["tools"] if t["name"] in ("Bash", "Workflow")],
            "system": body["system"][:2]}
    assert [m["role"] for m in body["messages"]] == ["user", "system"] and path.endswith("?beta=true")
    status, events = _events(server.url + path, body)
    kinds = [e["type"] for e in events]
    assert status == 200 and kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], events
    assert events[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1


def test_claude_code_title_request_follows_its_output_schema(server):
    path, body = _capture("claude_code_title")
    status, events = _events(server.url + path, {**body, "max_tokens": 40})
    assert status == 200, events
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text.lstrip().startswith('{"title"') or text.lstrip().startswith('{ "title"'), text
    if events[-2]["delta"]["stop_reason"] == "end_turn":
        assert isinstance(json.loads(text)["title"], str)


def test_codex_first_request_streams_to_the_end(server):
    path, body = _capture("codex_first")
    status, events = _events(server.url + path, {**body, "max_output_tokens": 8})
    kinds = [e["type"] for e in events]
    assert status == 200 and kinds[:2] == ["response.created", "response.in_progress"], events
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_codex_request_with_fewer_tools_calls_one_streamed(server):
    path, body = _capture("codex_first")
    tools = [t for t in body["tools"] if t.get("name") in ("exec_command", "multi_agent_v1") or t["type"] != "function"
             and t["type"] != "namespace"]
    assert {t["type"] for t in tools} == {"function", "namespace", "web_search"}
    body = {**body, "tools": tools, "input": body["input"][-1:], "tool_choice": "required", "max_output_tokens": 60}
    status, events = _events(server.url + path, body)
    kinds = [e["type"] for e in events]
    assert status == 200 and kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    call = events[-1]["response"]["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "exec_command" and call["call_id"]
    assert kinds[-2] == "response.output_item.done"
    # arguments the budget cut are never "done": that call closes incomplete, and a client must not run it (an
    # earlier call in the answer, closed whole, has its own .done)
    assert (kinds[-3] == "response.function_call_arguments.done") == (call["status"] == "completed")
    if kinds[-1] == "response.completed":
        assert call["status"] == "completed" and isinstance(json.loads(call["arguments"])["cmd"], str)
    else:
        assert kinds[-1] == "response.incomplete"


def test_codex_later_turn_is_one_turn_of_each_role_in_turn():
    """The results of parallel calls join one user turn, and the text beside a call joins the call's turn."""
    _, body = _capture("codex_later_turn")
    req = ResponsesRequest(**body)
    template = GEMMA.read_text()
    plan = plan_chat(template, input_messages(req), tools=function_tools(req.tools),
                     choice=chat_choice(req.tool_choice), parallel=req.parallel_tool_calls)
    roles = [m["role"] for m in plan.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"], roles
    assert len(plan.messages[5]["content"].splitlines()) == 3  # the three results, a JSON line each
    assert render_chat(template, list(plan.messages)).count("<start_of_turn>user") == 4


def test_codex_first_request_is_one_user_turn():
    """Codex sends its environment and the prompt as two user messages: they join one user turn."""
    _, body = _capture("codex_first")
    req = ResponsesRequest(**body)
    plan = plan_chat(GEMMA.read_text(), input_messages(req), tools=function_tools(req.tools))
    assert [m["role"] for m in plan.messages] == ["system", "user"]
    assert render_chat(GEMMA.read_text(), list(plan.messages)).count("<start_of_turn>user") == 1


def test_codex_later_turn_streams_on_a_template_that_wants_turns_in_turn(gemma_server):
    path, body = _capture("codex_later_turn")
    status, events = _events(gemma_server.url + path, {**body, "max_output_tokens": 8})
    kinds = [e["type"] for e in events]
    assert status == 200 and kinds[0] == "response.created", events
    assert kinds[-1] in ("response.completed", "response.incomplete")


def test_anthropic_client_with_annotation_only_schema_and_system_message(server):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    tool = {"name": "run", "description": "Run a workflow",
            "input_schema": {"type": "object", "properties": {"args": {"description": "Anything"},
                                                              "script": {"type": "string", "maxLength": 524288}},
                             "required": ["args", "script"]}}
    r = client.messages.create(model="x", max_tokens=60, tools=[tool], tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "Run the build."},
                                         {"role": "system", "content": "Be brief."}],  # type: ignore[list-item]
                               extra_body={"thinking": {"type": "disabled"}, "output_config": {"effort": "high"},
                                           "context_management": {"edits": []}, "temperature": 0})
    assert r.stop_reason in ("tool_use", "max_tokens")
    if r.stop_reason == "tool_use":
        assert r.content[-1].type == "tool_use" and isinstance(r.content[-1].input["script"], str)


def test_ollama_show_lists_tools(server):
    ollama = pytest.importorskip("ollama")
    info = ollama.Client(host=server.url).show("smollm2-135m")
    assert "tools" in info.capabilities and "completion" in info.capabilities
