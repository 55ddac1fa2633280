"""An agent session replayed turn by turn against a real server: the prompt cache keeps each turn's prompt.

The session is Claude Code's (tests/captures/claude_code_first.json: its system prompt, its first user message and
the system-role message after it, and the tools it uses most, to fit a small context), continued as Claude Code
continues it: each turn sends the
answer back as the assistant's message, the Bash call's result as a tool_result, and on some turns a system-role
notification after it. Every turn after the first must read at least 95 % of its prompt from the cache. Run with
`-s` to see the per-turn table (`replay` is also what docs/server.md's numbers come from, on Gemma-3-270M).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

CAPTURES = Path(__file__).parent / "captures"
GEMMA3 = Path(__file__).parent / "templates" / "gemma-3.jinja"
TURNS = 4
TOOLS = ("Agent", "Bash", "Edit", "Read", "TaskCreate", "TaskUpdate", "WebFetch", "Write")


def first_request() -> dict[str, Any]:
    body = json.loads((CAPTURES / "claude_code_first.json").read_text())["body"]
    tools = [t for t in body["tools"] if t["name"] in TOOLS]
    return {**body, "tools": tools, "max_tokens": 32, "stream": True, "tool_choice": {"type": "any"}}


def read_stream(url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """(content blocks as the client rebuilds them, the final usage, stop_reason) of one streamed answer."""
    blocks: list[dict[str, Any]] = []
    usage: dict[str, Any] = {}
    reason = ""
    with httpx.stream("POST", url + "/v1/messages?beta=true", json=body, timeout=900) as r:
        assert r.status_code == 200, r.read()
        for ln in r.iter_lines():
            if not ln.startswith("data: "):
                continue
            e = json.loads(ln[6:])
            if e["type"] == "content_block_start":
                blocks.append({**e["content_block"], "partial": ""})
            elif e["type"] == "content_block_delta":
                d = e["delta"]
                blocks[-1]["partial"] += d.get("text") or d.get("partial_json") or d.get("thinking") or ""
            elif e["type"] == "message_delta":
                usage, reason = e["usage"], e["delta"]["stop_reason"]
    out = []
    for b in blocks:
        text = b.pop("partial")
        if b["type"] == "tool_use":
            try:
                b["input"] = json.loads(text or "{}")
            except ValueError:
                b["input"] = {}
        elif b["type"] == "text":
            b["text"] = text
        if b["type"] != "thinking":
            out.append(b)
    return out, usage, reason


def replay(url: str, turns: int = TURNS) -> list[dict[str, Any]]:
    """Each turn's prompt tokens, tokens read from the cache, and stop reason."""
    body = first_request()
    msgs = list(body["messages"])
    rows = []
    for turn in range(turns):
        blocks, usage, reason = read_stream(url, {**body, "messages": msgs})
        cached = usage["cache_read_input_tokens"]
        rows.append({"turn": turn + 1, "prompt": usage["input_tokens"] + cached, "cached": cached, "stop": reason})
        msgs.append({"role": "assistant", "content": blocks})
        results = [{"type": "tool_result", "tool_use_id": b["id"], "content": f"notes{turn}.md\nsrc{turn}/"}
                   for b in blocks if b["type"] == "tool_use"]
        msgs.append({"role": "user", "content": results or "Go on."})
        if turn % 2 == 0:
            msgs.append({"role": "system", "content": f"<task-notification>Task {turn} finished.</task-notification>"})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| turn | prompt tokens | from the cache | reused | stop |", "|---|---|---|---|---|"]
    lines += [f"| {r['turn']} | {r['prompt']} | {r['cached']} | {100 * r['cached'] / r['prompt']:.1f} % | {r['stop']} |"
              for r in rows]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def server(smollm2_path) -> Iterator[ServerProcess]:
    """SmolLM2 with Gemma 3's template, which takes no system message mid-conversation (the folded case)."""
    with ServerProcess(["--ctx", "4096", "--threads", "2", "--chat-template-file", str(GEMMA3)]) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-20:])


def test_every_turn_after_the_first_reads_its_prompt_from_the_cache(server):
    rows = replay(server.url)
    print("\n" + table(rows))
    assert rows[0]["prompt"] > 2000  # a prompt worth keeping
    # each turn reads the whole previous prompt from the cache: what it cannot reuse is only what is new (the
    # last answer and the tool results, ~5 % of these turns, more or less as the answer runs)
    for before, r in zip(rows, rows[1:]):
        assert r["cached"] >= before["prompt"], table(rows)
    assert sum(r["cached"] for r in rows[1:]) >= 0.94 * sum(r["prompt"] for r in rows[1:]), table(rows)
