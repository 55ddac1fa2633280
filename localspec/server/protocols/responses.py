"""OpenAI's Responses API: `POST /v1/responses` (and llama-server's `/responses`), text in, one assistant message
out, whole or streamed, for `client.responses.create(...)` and agents built on it.

`input` is a string (one user message) or a list of messages (`role` user / assistant / system / developer;
`content` a string or `input_text` / `output_text` parts); `instructions` is a system message before them. The
messages go through the GGUF's chat template as on `/v1/chat/completions`; `text.format` (json_schema,
json_object) constrains the output as `response_format` does there. A budget that runs out ends the response
`incomplete` (`incomplete_details.reason: "max_output_tokens"`, the stream's last event `response.incomplete`),
as OpenAI reports it; llama-server says `completed` either way. Function tools are not served here (use
/v1/chat/completions): an item or tool that needs them is a 400.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ...errors import LocalspecError
from ..execution.run import Run, error_event
from ..execution.timings import speculative
from ..execution.worker import Job
from ..http import ApiError
from ..request.chat import chat_prompt
from ..request.sampling_fields import sampling
from ..request.schemas import MAX_TOKENS
from ..request.structured import request_extras
from ..state import State, StateDep

DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # OpenAI's
TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # store, metadata, user, truncation, ...: accepted, ignored

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=1 << 20)  # llama.cpp's
    min_p: float | None = Field(None, ge=0, le=1)  # llama.cpp's
    stream: bool = False
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    tools: list[dict[str, Any]] | None = None


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content parts")
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise ApiError(400, f"{where}: content part type {kind!r} is not supported (text parts only)")
        out.append(str(part.get("text", "")))
    return "".join(out)


def input_messages(req: ResponsesRequest) -> list[dict[str, str]]:
    """`instructions` and `input` as the chat messages the template reads."""
    msgs = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return msgs + [{"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        kind, role = item.get("type", "message"), item.get("role")
        if kind != "message" or not isinstance(role, str) or role not in ROLES:
            raise ApiError(400, f"input.{i}: only messages with role user, assistant, system or developer are "
                                f"supported (got type {kind!r}, role {role!r}; tool calls: /v1/chat/completions)")
        msgs.append({"role": ROLES[role], "content": _content(item.get("content"), f"input.{i}.content")})
    return msgs


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` in `response_format`'s shape (the Responses API puts the schema one level up)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, "text.format must be an object like {\"type\": \"json_object\"}")
    if fmt.get("type") != "json_schema":
        return fmt
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, "text.format of type json_schema needs a `schema` object")
    return {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}


def job(state: State, req: ResponsesRequest) -> Job:
    if req.tools:
        raise ApiError(400, "tools are not supported on /v1/responses; use /v1/chat/completions")
    prompt = chat_prompt(state.engine, input_messages(req))[0]  # a bad message list is a 400 here
    extra = request_extras(state.engine, response_format=response_format(req.text))
    params = sampling(req.temperature, req.top_k, req.top_p, req.min_p, None, defaults=DEFAULTS, **extra)
    return Job(lambda e: (prompt, False), params=params,
               max_tokens=state.budget(req.max_output_tokens, "max_output_tokens"),
               context_shift=state.config.context_shift, live=req.stream)


class Ids:
    """One response's names: `resp_...`, its message's `msg_...`, and when it was created."""

    def __init__(self) -> None:
        self.response = "resp_" + uuid.uuid4().hex[:24]
        self.message = "msg_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())


def output_item(ids: Ids, text: str | None, status: str) -> dict[str, Any]:
    """The assistant message; `text` None: not begun (no content part yet)."""
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": ids.message, "type": "message", "status": status, "role": "assistant", "content": content}


def status(run: Run) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details): a budget or context that ran out makes the response incomplete."""
    if run.last is not None and run.last.finish in ("length", "context"):
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def usage(run: Run) -> dict[str, Any]:
    """OpenAI counts cached tokens inside input_tokens."""
    n_in = run.started.n_prompt_tokens if run.started else 0
    n_out = run.stats.n_generated
    cached = run.job.first.n_cached if run.job.first else 0
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out}


def response_body(state: State, req: ResponsesRequest, ids: Ids, run: Run, output: list[dict[str, Any]],
                  done: bool) -> dict[str, Any]:
    """The Response object: in progress (`done` False: no usage yet) or finished."""
    st, details = status(run) if done else ("in_progress", None)
    return {"id": ids.response, "object": "response", "created_at": ids.created, "status": st, "error": None,
            "incomplete_details": details, "instructions": req.instructions, "model": state.model_name,
            "output": output, "max_output_tokens": req.max_output_tokens, "parallel_tool_calls": False,
            "temperature": run.job.params.temperature, "top_p": run.job.params.top_p, "tool_choice": "none",
            "tools": [], "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "truncation": "disabled", "store": False, "metadata": {},
            "usage": usage(run) if done else None, **({"speculative": speculative(state, run)} if done else {})}


async def answer(state: State, req: ResponsesRequest, run: Run, ids: Ids) -> Response:
    text = ""
    async for ch in run.chunks():
        text += ch.text
    if run.cancelled:
        return Response(status_code=499)  # the client hung up: nobody reads this
    item = output_item(ids, text, status(run)[0])
    return JSONResponse({**response_body(state, req, ids, run, [item], True), "timings": run.timings})



class Events:
    """The stream's events, numbered (`sequence_number`) and named (`event:` lines, as OpenAI sends them)."""

    def __init__(self, ids: Ids) -> None:
        self.ids = ids
        self.n = 0

    def __call__(self, kind: str, **data: Any) -> str:
        body = {"type": kind, "sequence_number": self.n, **data}
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    def part(self, kind: str, **data: Any) -> str:
        """An event about the message's one text part."""
        return self(kind, item_id=self.ids.message, output_index=0, content_index=0, **data)


async def events(state: State, req: ResponsesRequest, run: Run, ids: Ids) -> AsyncIterator[str]:
    """created, in_progress, the item and its part added, text deltas, then each closed, then completed (or
    incomplete); the Response object in the first and last events."""
    ev = Events(ids)
    begun = response_body(state, req, ids, run, [], False)
    yield ev("response.created", response=begun)
    yield ev("response.in_progress", response=begun)
    yield ev("response.output_item.added", output_index=0, item=output_item(ids, None, "in_progress"))
    yield ev.part("response.content_part.added", part={"type": "output_text", "text": "", "annotations": []})
    text = ""
    try:
        async for ch in run.chunks():
            if ch.text:
                text += ch.text
                yield ev.part("response.output_text.delta", delta=ch.text, logprobs=[])
    except LocalspecError as e:
        err = error_event(e)["error"]
        yield ev("error", code=err["type"], message=err["message"], param=None)
        return
    item = output_item(ids, text, status(run)[0])
    yield ev.part("response.output_text.done", text=text, logprobs=[])
    yield ev.part("response.content_part.done", part=item["content"][0])
    yield ev("response.output_item.done", output_index=0, item=item)
    final = response_body(state, req, ids, run, [item], True)
    yield ev("response.completed" if final["status"] == "completed" else "response.incomplete", response=final,
             timings=run.timings)


def router(state: State) -> APIRouter:
    """The routes; handlers reach `state` through `StateDep` (the same object app.py passes here)."""
    r = APIRouter(tags=["OpenAI"])
    r.add_api_route("/v1/responses", responses, methods=["POST"])
    r.add_api_route("/responses", responses, methods=["POST"], include_in_schema=False)
    return r


async def responses(req: ResponsesRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/v1/responses")
    run = Run(state, job(state, req), request)
    await run.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
    ids = Ids()
    if req.stream:
        return StreamingResponse(events(state, req, run, ids), media_type="text/event-stream")
    return await answer(state, req, run, ids)
