"""OpenAI's Responses API: `POST /v1/responses` (and llama-server's `/responses`), text in, one assistant message
out, whole or streamed, for `client.responses.create(...)` and agents built on it.

`input` is a string (one user message) or a list of items: messages (`role` user / assistant / system /
developer; `content` a string or `input_text` / `output_text` parts), `function_call` and
`function_call_output` items (an earlier call and its result, paired by `call_id`), and `reasoning` items (left
out, as the chat routes leave earlier thinking out). `instructions` and the system or developer messages before
the first other item become one system message first; a later one stays where it was sent, so each turn's prompt
begins with the turn before's. The messages go through the GGUF's chat template as on
`/v1/chat/completions`, with the same tool plan: function `tools`, `tool_choice` (auto / none / required / a
named function) and `parallel_tool_calls`; tools this server cannot run (`web_search`, a `namespace` of tools,
...) are left out. The answer's calls are `function_call` output items with a `call_id`, streamed in OpenAI's
order (`output_item.added`, `function_call_arguments.delta` / `.done`, `output_item.done`). `text.format`
(json_schema, json_object) constrains the output as `response_format` does there. A budget that runs out ends the
response `incomplete` (`incomplete_details.reason: "max_output_tokens"`, the stream's last event
`response.incomplete`), as OpenAI reports it; llama-server says `completed` either way. llama-server's stream
options work as on its chat route: `return_progress` adds `response.in_progress` events carrying
`prompt_progress`, and `timings_per_token` a `timings` block on the last event of each round.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...engine.answer import Answer, AnswerDelta, AnswerStream, Reading, read_answer
from ...engine.chatplan import ChatPlan
from ...engine.engine import Chunk
from ...engine.tools import ToolCall
from ...errors import LocalspecError
from ..execution.run import SSE_KEEPALIVE, Run, error_event
from ..execution.timings import progress_fields, speculative
from ..execution.worker import Job, Progress
from ..request.sampling_fields import sampling
from ..request.structured import request_extras
from ..state import State, StateDep
from .responses_request import ResponsesRequest, response_format, setup

DEFAULTS = {"temperature": 1.0, "top_p": 1.0}  # OpenAI's


def job(state: State, req: ResponsesRequest, chat: ChatPlan, prompt: str) -> Job:
    extra = request_extras(state.engine, response_format=response_format(req.text), tool_grammar=chat.grammar)
    params = sampling(req.temperature, req.top_k, req.top_p, req.min_p, None, defaults=DEFAULTS, **extra)
    return Job(lambda e: (prompt, False), params=params,
               max_tokens=state.budget(req.max_output_tokens, "max_output_tokens"),
               context_shift=state.config.context_shift, live=req.stream)


class Ids:
    """One response's names: `resp_...`, its message's `msg_...` and reasoning's `rs_...`, and when it began."""

    def __init__(self) -> None:
        self.response = "resp_" + uuid.uuid4().hex[:24]
        self.message = "msg_" + uuid.uuid4().hex[:24]
        self.reasoning = "rs_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())


def output_item(ids: Ids, text: str | None, status: str) -> dict[str, Any]:
    """The assistant message; `text` None: not begun (no content part yet)."""
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": ids.message, "type": "message", "status": status, "role": "assistant", "content": content}


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    """A function_call output item; the client answers it with a function_call_output of the same call_id."""
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call.id, "name": call.name, "arguments": call.arguments}


def reasoning_item(ids: Ids, text: str) -> dict[str, Any]:
    return {"id": ids.reasoning, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def output_items(ids: Ids, answer: Answer, status: str) -> list[dict[str, Any]]:
    """Reasoning (when the model reasoned), the message (unless only calls came back), then one item a call."""
    items = [reasoning_item(ids, answer.reasoning)] if answer.reasoning else []
    if answer.content or not answer.calls:
        items.append(output_item(ids, answer.content, status))
    return items + [call_item(c, call_status(c.arguments, status)) for c in answer.calls]


def call_status(arguments: str, status: str) -> str:
    """A call in a response cut by its budget is `incomplete` when its arguments were cut too (not one whole JSON
    value), as OpenAI marks the item the budget ended: a client must not run it."""
    if status != "incomplete":
        return "completed"
    try:
        json.loads(arguments)
    except ValueError:
        return "incomplete"
    return "completed"


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
            "output": output, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls, "temperature": run.job.params.temperature,
            "top_p": run.job.params.top_p, "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "truncation": "disabled", "store": False, "metadata": {},
            "usage": usage(run) if done else None, **({"speculative": speculative(state, run)} if done else {})}


async def answer(state: State, req: ResponsesRequest, run: Run, ids: Ids, reading: Reading) -> Response:
    text = ""
    async for ch in run.chunks():
        text += ch.text
    if run.cancelled:
        return Response(status_code=499)  # the client hung up: nobody reads this
    items = output_items(ids, read_answer(text, reading), status(run)[0])
    return JSONResponse({**response_body(state, req, ids, run, items, True), "timings": run.timings})


class Events:
    """The stream's events, numbered (`sequence_number`) and named (`event:` lines, as OpenAI sends them)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **data: Any) -> str:
        body = {"type": kind, "sequence_number": self.n, **data}
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    @staticmethod
    def adding(event: str, **data: Any) -> str:
        """`event` (one of ours) with more fields in its data: llama-server puts a round's `timings` on its last
        event."""
        head, body = event.split("data: ", 1)
        return f"{head}data: {json.dumps({**json.loads(body), **data})}\n\n"


class Items:
    """The stream's output items, each opened when the answer reaches it and closed before the next: the
    reasoning (whole, once it ends), the message (its text part's deltas), each call (its arguments' deltas)."""

    def __init__(self, ev: Events, ids: Ids) -> None:
        self.ev, self.ids = ev, ids
        self.done: list[dict[str, Any]] = []  # closed items; the open one's output_index is len(done)
        self.open: dict[str, Any] | None = None
        self.reasoning = ""

    def push(self, d: AnswerDelta) -> list[str]:
        self.reasoning += d.reasoning
        out = []
        if d.content:
            if self.open is None or self.open["type"] != "message":
                out += self._open_message()
            assert self.open is not None
            self.open["content"][0]["text"] += d.content
            out.append(self._part("response.output_text.delta", delta=d.content, logprobs=[]))
        for c in d.calls:
            if c.id is not None:
                out += self._open(call_item(ToolCall(c.name or "", "", c.id), "in_progress"))
            if c.arguments and self.open is not None and self.open["type"] == "function_call":
                self.open["arguments"] += c.arguments
                out.append(self.ev("response.function_call_arguments.delta", item_id=self.open["id"],
                                   output_index=len(self.done), delta=c.arguments))
        return out

    def finish(self, status: str) -> list[str]:
        """Close the open item; an answer with nothing in it still gets its (empty) message."""
        out = self._reasoned()
        if self.open is None and not any(i["type"] != "reasoning" for i in self.done):
            out += self._open_message()
        return out + self._close(status)

    def _open_message(self) -> list[str]:
        out = self._open(output_item(self.ids, None, "in_progress"))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.open = {**self.open, "content": [part]} if self.open else None
        return out + [self._part("response.content_part.added", part=dict(part))]

    def _open(self, item: dict[str, Any]) -> list[str]:
        out = self._close("completed") + self._reasoned()
        self.open = item
        return out + [self.ev("response.output_item.added", output_index=len(self.done), item=dict(item))]

    def _reasoned(self) -> list[str]:
        """The reasoning as one whole item, once the answer has moved past it."""
        if not self.reasoning:
            return []
        item, self.reasoning = reasoning_item(self.ids, self.reasoning), ""
        self.done.append(item)
        return [self.ev("response.output_item.added", output_index=len(self.done) - 1, item=item),
                self.ev("response.output_item.done", output_index=len(self.done) - 1, item=item)]

    def _part(self, kind: str, **data: Any) -> str:
        assert self.open is not None
        return self.ev(kind, item_id=self.open["id"], output_index=len(self.done), content_index=0, **data)

    def _close(self, status: str) -> list[str]:
        item, out = self.open, []
        if item is None:
            return []
        if item["type"] == "message":
            part = item["content"][0]
            item["status"] = status
            out = [self._part("response.output_text.done", text=part["text"], logprobs=[]),
                   self._part("response.content_part.done", part=part)]
        else:
            item["status"] = call_status(item["arguments"], status)
            out = [] if item["status"] == "incomplete" else [  # arguments that were cut are not done
                self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=len(self.done),
                        name=item["name"], arguments=item["arguments"])]
        out.append(self.ev("response.output_item.done", output_index=len(self.done), item=item))
        self.done.append(item)
        self.open = None
        return out


async def events(state: State, req: ResponsesRequest, run: Run, ids: Ids, reading: Reading) -> AsyncIterator[str]:
    """created, in_progress, each output item added, its deltas and done (Items), then completed (or
    incomplete); the Response object in the first and last events."""
    ev = Events()
    begun = response_body(state, req, ids, run, [], False)
    yield ev("response.created", response=begun)
    yield ev("response.in_progress", response=begun)
    items, answer = Items(ev, ids), AnswerStream(reading)
    try:
        async for ch in run.events(req.return_progress):
            if not isinstance(ch, Chunk):  # the prompt is still being read
                yield _waiting(req, ev, begun, ch)
                continue
            out = items.push(answer.push(ch.text))
            if out and req.timings_per_token:
                out[-1] = Events.adding(out[-1], timings=run.timings)
            for event in out:
                yield event
    except LocalspecError as e:
        err = error_event(e)["error"]
        yield ev("error", code=err["type"], message=err["message"], param=None)
        return
    for event in items.push(answer.finish()) + items.finish(status(run)[0]):
        yield event
    final = response_body(state, req, ids, run, items.done, True)
    yield ev("response.completed" if final["status"] == "completed" else "response.incomplete", response=final,
             timings=run.timings)


def _waiting(req: ResponsesRequest, ev: Events, begun: dict[str, Any], p: Progress | None) -> str:
    """What the stream sends while the prompt is read: llama-server's `response.in_progress` with
    `prompt_progress` when asked (`return_progress`), else an SSE comment that keeps the connection alive."""
    if p is None or not req.return_progress:
        return SSE_KEEPALIVE
    return ev("response.in_progress", response=begun, **progress_fields(p, req.timings_per_token))


def router(state: State) -> APIRouter:
    """The routes; handlers reach `state` through `StateDep` (the same object app.py passes here)."""
    r = APIRouter(tags=["OpenAI"])
    r.add_api_route("/v1/responses", responses, methods=["POST"])
    r.add_api_route("/responses", responses, methods=["POST"], include_in_schema=False)
    return r


async def responses(req: ResponsesRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/v1/responses")
    chat, prompt = setup(state, req)
    # in a thread: the job builds the request's grammar, seconds for a large one (execution/run.py, Choices._start)
    run = Run(state, await asyncio.to_thread(job, state, req, chat, prompt), request)
    await run.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
    ids, reading = Ids(), chat.reading(prompt)
    if req.stream:
        return StreamingResponse(events(state, req, run, ids, reading), media_type="text/event-stream")
    return await answer(state, req, run, ids, reading)
