"""A thinking model's answer (Qwen 3's shape: a `<think>` block, then text and Hermes calls) read back whole and
streamed a character at a time: the same reasoning, content and calls either way; a call inside the reasoning is
not a call; `--reasoning-format none` leaves the block in the content.
"""

from __future__ import annotations

import json

import pytest

from localspec.engine.answer import Answer, AnswerStream, Reading, read_answer
from localspec.engine.tools import ToolPlan

FNS = [{"name": "get_weather", "parameters": {"type": "object"}}]
HERMES = ToolPlan("hermes", FNS, required=False, parallel=True, grammar=None)
ANSWER = ('<think>\nMaybe <tool_call>{"name": "no", "arguments": {}}</tool_call> later.\n</think>\n\n'
          'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


def streamed(text: str, reading: Reading) -> Answer:
    s = AnswerStream(reading)
    reasoning, content, args = "", "", {}
    for d in [s.push(ch) for ch in text] + [s.finish()]:
        reasoning += d.reasoning
        content += d.content
        for c in d.calls:
            args[c.index] = args.get(c.index, "") + c.arguments
    assert [c.arguments for c in s.calls] == [args[i] for i in sorted(args)]
    return Answer(reasoning, content, s.calls)


def parts(a: Answer) -> tuple[str, str, list]:
    return a.reasoning, a.content, [(c.name, json.loads(c.arguments)) for c in a.calls]


@pytest.mark.parametrize("read", [read_answer, streamed])
def test_reasoning_then_calls(read) -> None:
    got = parts(read(ANSWER, Reading(HERMES, "auto")))
    assert got == ('Maybe <tool_call>{"name": "no", "arguments": {}}</tool_call> later.', "Checking.\n",
                   [("get_weather", {"city": "Paris"})])


@pytest.mark.parametrize("read", [read_answer, streamed])
def test_reasoning_format_none_keeps_the_block_in_the_content(read) -> None:
    reasoning, content, calls = parts(read("<think>hm</think>Hi", Reading(None, "none")))
    assert (reasoning, content, calls) == ("", "<think>hm</think>Hi", [])


@pytest.mark.parametrize("read", [read_answer, streamed])
def test_no_tools_no_thinking_is_plain_content(read) -> None:
    assert parts(read("Just text.", Reading())) == ("", "Just text.", [])
