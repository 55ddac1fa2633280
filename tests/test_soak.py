"""The soak's judgement (scripts/soak/: soak_traffic.py, soak_ledger.py) on hand-written answers: a stream with
its closing event is answered, a last error event naming the SIGSEGV is a crash in each protocol's framing, a
stream cut without one is a failure, and a runner's counters that differ from what it was sent are a mismatch.
The soak itself runs by hand (docs/bench/soak.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "soak"))
from soak_ledger import Ledger, parse_metrics  # noqa: E402
from soak_traffic import StreamReader  # noqa: E402

CRASH = "localspec: llama.cpp crashed (SIGSEGV, a segmentation fault)"


def _read(protocol: str, lines: list[str]) -> tuple[str, str]:
    reader = StreamReader(protocol)
    for line in lines:
        reader.line(line)
    return reader.outcome()


@pytest.mark.parametrize("protocol, lines", [
    ("oai_chat", ['data: {"choices": [{"delta": {"content": "Hi"}}]}', "data: [DONE]"]),
    ("completion", ['data: {"content": "Hi", "stop": false}', 'data: {"content": "", "stop": true}']),
    ("ollama_generate", ['{"response": "Hi", "done": false}', '{"response": "", "done": true}']),
    ("anthropic", ["event: message_start", 'data: {"type": "message_start"}', "event: message_stop",
                   'data: {"type": "message_stop"}']),
    ("responses", ["event: response.created", 'data: {"type": "response.created"}', "event: response.incomplete",
                   'data: {"type": "response.incomplete"}']),
])
def test_a_stream_with_its_closing_event_is_answered(protocol, lines):
    assert _read(protocol, lines)[0] == "answered"


@pytest.mark.parametrize("protocol, last", [
    ("oai_chat", f'data: {{"error": {{"message": "{CRASH}", "type": "server_error"}}}}'),
    ("ollama_chat", f'{{"error": "llama runner process has terminated: {CRASH}"}}'),
    ("anthropic", f'data: {{"type": "error", "error": {{"type": "api_error", "message": "{CRASH}"}}}}'),
    ("responses", f'data: {{"type": "error", "code": "server_error", "message": "{CRASH}", "param": null}}'),
])
def test_a_last_error_event_naming_the_sigsegv_is_a_crash(protocol, last):
    first = '{"message": {"content": "Hi"}, "done": false}' if protocol.startswith("ollama") else 'data: {"x": 1}'
    kind, detail = _read(protocol, [first, "event: error" if "type" in last else "", last])
    assert kind == "crashed" and "SIGSEGV" in detail


def test_a_stream_cut_without_its_error_event_is_a_failure():
    assert _read("oai_chat", ['data: {"choices": [{"delta": {"content": "Hi"}}]}'])[0] == "failed"


def test_counters_are_read_by_route_and_a_difference_is_a_mismatch():
    text = ('localspec_requests_total{route="/completion"} 3\nlocalspec_requests_total{route="/api/chat"} 1\n'
            "localspec_request_errors_total 1\nlocalspec_requests_cancelled_total 2\n")
    counts = parse_metrics(text)
    assert counts.routes == {"/completion": 3, "/api/chat": 1} and (counts.errors, counts.cancelled) == (1, 2)
    ledger = Ledger(["m"])
    for route in ("/completion", "/completion", "/completion", "/api/chat"):
        ledger.book("m", route)
    assert ledger.check("m", 100, counts) is None
    ledger.book("m", "/completion")
    assert "sent" in (ledger.check("m", 100, counts) or "")


def test_a_runner_replaced_with_no_event_is_a_mismatch_and_an_ended_one_is_not():
    counts = parse_metrics("")
    ledger = Ledger(["m"])
    assert ledger.check("m", 100, counts) is None
    ledger.end("m")
    assert ledger.check("m", 200, counts) is None
    assert "replaced" in (ledger.check("m", 300, counts) or "")
