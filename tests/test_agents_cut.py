"""A call cut by the token budget is never sent as a finished call: on /v1/responses its item is `incomplete` (as
OpenAI marks the item a budget ended; the arguments are not `done`), and on /v1/messages the stop reason is
`max_tokens`, not `tool_use` (Anthropic's: the cut tool_use block is sent as far as it got, and the client asks
again with a larger budget instead of running it).
"""

from __future__ import annotations

import json

from localspec.engine.answer import AnswerDelta
from localspec.engine.engine import Chunk
from localspec.engine.stats import Stats
from localspec.engine.tools import ToolCallDelta
from localspec.server.protocols.anthropic.convert import stop_reason
from localspec.server.protocols.responses import Events, Ids, Items, call_status
from localspec.speculative.types import Step


def _events(out: list[str]) -> list[dict]:
    return [json.loads(e.split("data: ", 1)[1]) for e in out]


def streamed_call(arguments: str, status: str) -> list[dict]:
    items = Items(Events(), Ids())
    out = items.push(AnswerDelta(calls=[ToolCallDelta(0, "", "call_1", "exec_command")]))
    out += items.push(AnswerDelta(calls=[ToolCallDelta(0, arguments)]))
    return _events(out + items.finish(status))


def test_a_stream_cut_inside_a_call_closes_it_incomplete():
    events = streamed_call('{"', "incomplete")
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.done" not in kinds  # the arguments never ended
    assert events[-1]["type"] == "response.output_item.done"
    assert events[-1]["item"]["status"] == "incomplete" and events[-1]["item"]["arguments"] == '{"'


def test_a_whole_call_before_the_cut_is_completed():
    events = streamed_call('{"cmd": "ls"}', "incomplete")
    assert events[-1]["item"]["status"] == "completed"
    assert "response.function_call_arguments.done" in [e["type"] for e in events]
    assert streamed_call('{"cmd": "ls"}', "completed")[-1]["item"]["status"] == "completed"


def test_call_status():
    assert call_status('{"a": 1}', "incomplete") == "completed"
    assert call_status('{"a": ', "incomplete") == "incomplete"
    assert call_status('{"a": ', "completed") == "completed"  # only a cut response has cut calls


def _last(finish: str) -> Chunk:
    return Chunk("", Step(tokens=(1,), drafted=0, accepted=0, t_draft=0.0, t_verify=0.0, finish=finish), Stats(),
                 finish)


def test_anthropic_says_max_tokens_for_a_call_the_budget_cut():
    assert stop_reason(_last("length"), "", "", (), True) == ("max_tokens", None)
    assert stop_reason(_last("stop"), "", "", (), True) == ("tool_use", None)
