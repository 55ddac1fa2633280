"""The soak's requests (scripts/soak/soak.py): one body per protocol, sent whole or streamed, and what came back,
sorted into the outcomes the soak counts.

Every request ends in one of: `answered` (the protocol's answer, a stream with its closing event), `refused`
(the protocol's error body with a status of 400 or more, e.g. /infill to a model with no FIM tokens), `crashed`
(the protocol's error naming the runner's SIGSEGV: a 502, a 500 under /api/, or a stream's last error event),
`hung_up` (the client left on purpose, mid-stream or mid-answer) or `failed` (anything else: a timeout, a broken
connection, a stream cut without its error event, an answer without its fields).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

PROTOCOLS = ("oai_chat", "oai_completions", "completion", "infill", "ollama_chat", "ollama_generate",
             "anthropic", "responses")
ROUTE = {"oai_chat": "/v1/chat/completions", "oai_completions": "/v1/completions", "completion": "/completion",
         "infill": "/infill", "ollama_chat": "/api/chat", "ollama_generate": "/api/generate",
         "anthropic": "/v1/messages", "responses": "/v1/responses"}
TIMEOUT_S = 300.0  # a request still unanswered after this is a failure (a runner may be loading meanwhile)


@dataclass
class Req:
    """One request. `hang_up`: "stream" leaves after the first event, "whole" after `hang_up_s` seconds.
    `on_first` runs once the first event of a stream arrived (the soak kills the runner there)."""

    protocol: str
    model: str
    prompt: str
    n: int
    stream: bool
    hang_up: str | None = None
    hang_up_s: float = 0.4
    keep_alive: float | None = None
    on_first: Callable[[], Any] | None = None

    @property
    def route(self) -> str:
        return ROUTE[self.protocol]


@dataclass
class Outcome:
    req: Req
    kind: str  # answered, refused, crashed, hung_up, failed
    status: int = 0
    detail: str = ""
    seconds: float = 0.0
    events: int = field(default=0)


def body(r: Req) -> dict[str, Any]:
    """The request's JSON in its protocol's field names; every answer is short (r.n tokens)."""
    msgs = [{"role": "user", "content": r.prompt}]
    p, m, n, s = r.protocol, r.model, r.n, r.stream
    if p == "oai_chat":
        out: dict[str, Any] = {"model": m, "messages": msgs, "max_tokens": n, "stream": s}
    elif p == "oai_completions":
        out = {"model": m, "prompt": r.prompt, "max_tokens": n, "stream": s}
    elif p == "completion":
        out = {"model": m, "prompt": r.prompt, "n_predict": n, "stream": s}
    elif p == "infill":
        out = {"model": m, "input_prefix": "def add(a, b):\n", "input_suffix": "\n", "prompt": "    return ",
               "n_predict": n, "stream": s}
    elif p == "ollama_chat":
        out = {"model": m, "messages": msgs, "stream": s, "options": {"num_predict": n}}
    elif p == "ollama_generate":
        out = {"model": m, "prompt": r.prompt, "stream": s, "options": {"num_predict": n}}
    elif p == "anthropic":
        out = {"model": m, "messages": msgs, "max_tokens": n, "stream": s}
    else:
        out = {"model": m, "input": r.prompt, "max_output_tokens": n, "stream": s}
    if r.keep_alive is not None:
        out["keep_alive"] = r.keep_alive
    return out


def _answer_ok(protocol: str, data: Any) -> bool:
    """Whether a whole answer has its protocol's fields."""
    if not isinstance(data, dict):
        return False
    if protocol in ("oai_chat", "oai_completions"):
        return bool(data.get("choices"))
    if protocol in ("completion", "infill"):
        return "content" in data
    if protocol == "ollama_chat":
        return "message" in data and data.get("done") is True
    if protocol == "ollama_generate":
        return "response" in data and data.get("done") is True
    if protocol == "anthropic":
        return data.get("type") == "message" and "content" in data
    return data.get("object") == "response" and "output" in data


def error_text(data: Any) -> str | None:
    """The message of an error in any protocol's shape, or None when `data` is not one."""
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, str):  # Ollama
        return err
    if isinstance(err, dict):  # OpenAI, llama.cpp, Anthropic ({"type": "error", "error": {...}})
        return str(err.get("message", err))
    if data.get("type") == "error":  # a Responses error event
        return str(data.get("message", data))
    return None


def _whole(r: Req, status: int, raw: bytes) -> tuple[str, str]:
    try:
        data = json.loads(raw)
    except ValueError:
        return "failed", f"not JSON: {raw[:120]!r}"
    if status == 200:
        return ("answered", "") if _answer_ok(r.protocol, data) else ("failed", f"no answer fields: {raw[:160]!r}")
    msg = error_text(data)
    if msg is None:
        return "failed", f"{status} without an error body: {raw[:160]!r}"
    return ("crashed" if "SIGSEGV" in msg else "refused"), f"{status} {msg[:160]}"


class StreamReader:
    """Reads a stream's lines: counts events, notes the closing event and an error event."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.events = 0
        self.done = False
        self.error: str | None = None
        self._event = ""

    def line(self, line: str) -> None:
        if line.startswith("event:"):
            self._event = line[6:].strip()
            if self._event in ("message_stop", "response.completed", "response.incomplete"):
                self.done = True
            return
        text = line[5:].strip() if line.startswith("data:") else line.strip()
        if not text:
            return
        if text == "[DONE]":
            self.done = True
            return
        self.events += 1
        try:
            data = json.loads(text)
        except ValueError:
            self.error = f"not JSON: {text[:120]}"
            return
        msg = error_text(data)
        if msg is not None or self._event == "error":
            self.error = msg or text[:160]
        elif self.protocol in ("completion", "infill") and data.get("stop") is True:
            self.done = True
        elif self.protocol.startswith("ollama") and data.get("done") is True:
            self.done = True

    def outcome(self) -> tuple[str, str]:
        if self.error is not None:
            return ("crashed" if "SIGSEGV" in self.error else "refused"), self.error[:160]
        return ("answered", "") if self.done else ("failed", f"stream ended without its closing event after "
                                                            f"{self.events} events")


async def _streamed(client: httpx.AsyncClient, r: Req) -> Outcome:
    async with client.stream("POST", r.route, json=body(r)) as resp:
        if resp.status_code != 200:
            kind, detail = _whole(r, resp.status_code, await resp.aread())
            return Outcome(r, kind, resp.status_code, detail)
        reader = StreamReader(r.protocol)
        async for line in resp.aiter_lines():
            reader.line(line)
            if reader.events == 1 and r.on_first is not None:  # even when that event ended the answer
                r.on_first()
                r.on_first = None
            if reader.events == 1 and not reader.done:
                if r.hang_up == "stream":  # leaving the block closes the connection mid-stream
                    return Outcome(r, "hung_up", 200, "after the first event", events=1)
        kind, detail = reader.outcome()
        return Outcome(r, kind, 200, detail, events=reader.events)


async def _whole_request(client: httpx.AsyncClient, r: Req) -> Outcome:
    if r.hang_up == "whole":
        try:
            resp = await asyncio.wait_for(client.post(r.route, json=body(r)), r.hang_up_s)
        except asyncio.TimeoutError:  # cancelling the post closes its connection: the router sees a hang-up
            return Outcome(r, "hung_up", 0, f"after {r.hang_up_s} s")
    else:
        resp = await client.post(r.route, json=body(r))
    kind, detail = _whole(r, resp.status_code, resp.content)
    return Outcome(r, kind, resp.status_code, detail)


async def send(client: httpx.AsyncClient, r: Req) -> Outcome:
    """Send `r` and sort what came back; never raises (a transport error is a `failed` outcome)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        out = await asyncio.wait_for(_streamed(client, r) if r.stream else _whole_request(client, r), TIMEOUT_S)
    except asyncio.TimeoutError:
        out = Outcome(r, "failed", 0, f"no answer in {TIMEOUT_S:.0f} s")
    except httpx.HTTPError as e:
        out = Outcome(r, "failed", 0, f"{type(e).__name__}: {e}"[:200])
    out.seconds = loop.time() - t0
    return out
