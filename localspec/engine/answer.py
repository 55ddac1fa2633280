"""A chat answer read back as reasoning, content and tool calls, whole or streamed: the `<think>` block is split
off first (reasoning.py), then the rest is read for the plan's tool calls (tools.py).

The order matters: a thinking model reasons before it calls (Qwen 3, DeepSeek R1), and a call written inside its
reasoning is not a call. One reader serves every chat front end, so OpenAI's, Ollama's and Anthropic's routes
agree on what the model said.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .reasoning import ReasoningStream, split_reasoning
from .tools import ToolCall, ToolCallDelta, ToolCallStream, ToolPlan


@dataclass(frozen=True)
class Reading:
    """How to read one request's answer: its tool plan (None: no tools), `--reasoning-format`, and whether the
    prompt ended inside a think block (the template opened it, so the answer starts as reasoning)."""

    plan: ToolPlan | None = None
    reasoning: str = "none"
    started: bool = False


@dataclass(frozen=True)
class Answer:
    reasoning: str
    content: str
    calls: list[ToolCall]


def read_answer(text: str, reading: Reading) -> Answer:
    """The whole answer's parts."""
    reasoning, content = split_reasoning(text, reading.reasoning, started=reading.started)
    content, calls = reading.plan.parse(content) if reading.plan else (content, [])
    return Answer(reasoning, content, calls)


@dataclass(frozen=True)
class AnswerDelta:
    """What one streamed piece adds to each part; the pieces of a stream add up to `read_answer`'s parts."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class AnswerStream:
    """Text deltas in, `AnswerDelta`s out; `calls` (with the ids the deltas announced) once `finish()` has run."""

    def __init__(self, reading: Reading) -> None:
        self._reasoning = ReasoningStream(reading.reasoning, started=reading.started)
        self._tools: ToolCallStream | None = reading.plan.stream() if reading.plan else None

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools else []

    def push(self, text: str) -> AnswerDelta:
        reasoning, content = self._reasoning.push(text)
        return self._tool_parts(reasoning, content, final=False)

    def finish(self) -> AnswerDelta:
        reasoning, content = self._reasoning.finish()
        return self._tool_parts(reasoning, content, final=True)

    def _tool_parts(self, reasoning: str, content: str, *, final: bool) -> AnswerDelta:
        if self._tools is None:
            return AnswerDelta(reasoning, content)
        text, calls = self._tools.push(content)
        if final:
            more, last = self._tools.finish()
            text, calls = text + more, calls + last
        return AnswerDelta(reasoning, text, calls)
