"""The streamed answer of `/v1/messages`, in Anthropic's event order: `message_start` and `ping` as soon as the
prompt is known to fit (a `ping` again every 10 s without a byte while the prompt is read), then per content
block `content_block_start` / `content_block_delta` (`thinking_delta`, `text_delta`, or `input_json_delta` for
a tool call's arguments) / `content_block_stop` with its index, then `message_delta` (stop_reason,
stop_sequence, usage) and `message_stop`. Every event is sent as `event: NAME` + `data: {...}`: the `anthropic`
client dispatches on the event name. A failure mid-stream is an `error` event, as Anthropic sends one.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from ....engine.answer import AnswerDelta, AnswerStream, Reading
from ....engine.engine import Chunk
from ....errors import LocalspecError
from ...execution.run import Run
from ...execution.timings import speculative
from ...http import anthropic_error
from ...state import State
from .convert import message_body, stop_reason, tool_use_id, usage


def sse(kind: str, **data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


class Blocks:
    """Content blocks as Anthropic streams them: one open at a time, indices 0, 1, 2... in order. Reasoning opens
    a thinking block, text a text block (each continues the open one of its kind); a call's first delta opens a
    tool_use block, its later deltas append to its input's JSON. A thinking block closes with a (empty)
    signature_delta, which Anthropic's clients expect."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking", "text" or "tool_use"

    def push(self, delta: AnswerDelta) -> list[str]:
        out = self._text("thinking", delta.reasoning) + self._text("text", delta.content)
        for d in delta.calls:
            if d.id is not None:
                out += self._start({"type": "tool_use", "id": tool_use_id(d.id), "name": d.name, "input": {}})
            if d.arguments and self.open == "tool_use":
                out.append(self._delta({"type": "input_json_delta", "partial_json": d.arguments}))
        return out

    def finish(self) -> list[str]:
        """Close the open block; an answer with no content at all still gets its (empty) text block."""
        out = [] if self.index >= 0 else self._start({"type": "text", "text": ""})
        return out + self._close()

    def _text(self, kind: str, text: str) -> list[str]:
        if not text:
            return []
        out = [] if self.open == kind else self._start({"type": kind, kind: ""})
        return out + [self._delta({"type": f"{kind}_delta", kind: text})]

    def _start(self, block: dict[str, Any]) -> list[str]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        return out + [sse("content_block_start", index=self.index, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> str:
        return sse("content_block_delta", index=self.index, delta=delta)

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        out = [self._delta({"type": "signature_delta", "signature": ""})] if self.open == "thinking" else []
        self.open = None
        return out + [sse("content_block_stop", index=self.index)]


async def events(state: State, reading: Reading, run: Run, ident: str) -> AsyncIterator[str]:
    """The whole stream of one request whose job has started."""
    yield sse("message_start", message=message_body(state, ident, [], None, None, {**usage(run), "output_tokens": 0}))
    yield sse("ping")
    blocks, answer = Blocks(), AnswerStream(reading)
    text, tokens = "", list[int]()
    try:
        async for ch in run.events():
            if not isinstance(ch, Chunk):  # the prompt is still being read: Anthropic's keep-alive
                yield sse("ping")
                continue
            text += ch.text
            tokens.extend(ch.step.tokens)
            for e in blocks.push(answer.push(ch.text)):
                yield e
    except LocalspecError as err:
        status, kind = getattr(err, "status", 400), getattr(err, "kind", "")
        yield sse("error", error=anthropic_error(status, str(err), kind)["error"])
        return
    for e in blocks.push(answer.finish()) + blocks.finish():
        yield e
    raw = state.engine.target.detokenize(tokens)
    reason, seq = stop_reason(run.last, text, raw, run.job.stop, bool(answer.calls))
    yield sse("message_delta", delta={"stop_reason": reason, "stop_sequence": seq}, usage=usage(run),
              speculative=speculative(state, run))
    yield sse("message_stop")
