"""llama-server's editor rules (editor.py) and `response_fields` (completion.py), on hand-made chunks: pure."""

from __future__ import annotations

from localspec.engine.engine import Chunk
from localspec.engine.stats import Stats
from localspec.server.protocols.completion import project
from localspec.server.protocols.editor import EditorRules
from localspec.server.request.schemas import InfillRequest
from localspec.speculative.types import Step


def at(text: str, ms: float) -> Chunk:
    """A round's chunk: its text, after `ms` of generation."""
    return Chunk(text, Step(tokens=(1,), drafted=0, accepted=0, t_draft=0.0, t_verify=0.0), Stats(gen_ms=ms))


def test_t_max_predict_ms_stops_upon_a_newline_generated_over_budget():
    """llama-server's rule: a newline before the budget runs out does not stop; once over, the next newline
    does, and it is kept (whole lines), the rest of that round dropped."""
    rules = EditorRules(InfillRequest(t_max_predict_ms=250, n_indent=0))
    assert rules.push(at("def f():\n", 100)) == ("def f():\n", "none")
    assert rules.push(at("    return", 260)) == ("    return", "none")  # over budget, no newline yet
    assert rules.push(at(" 1\n\ndef", 270)) == (" 1\n", "limit")
    assert rules.text == "def f():\n    return 1\n"


def test_editor_rules_judge_each_chunk_once():
    """With a rule set, the worker judges each chunk (`Job.until`) and the event loop reads that verdict: the
    text the rules track grows once per chunk, not once per thread."""
    rules = EditorRules(InfillRequest(t_max_predict_ms=250, n_indent=0))
    assert rules.until is not None
    first, second = at("def f():\n", 100), at("    return 1\nx", 300)
    assert not rules.until(first) and rules.until(second)  # on the worker, before each chunk is sent
    assert rules.verdict(first) == ("def f():\n", "none")  # on the event loop, in the same order
    assert rules.verdict(second) == ("    return 1\n", "limit")
    assert rules.text == "def f():\n    return 1\n"
    plain = EditorRules(InfillRequest())
    assert plain.until is None  # nothing to cut: the event loop judges alone
    assert plain.verdict(at("a", 0)) == ("a", "none") and plain.text == "a"


def test_response_fields_projection_is_flat_by_path():
    body = {"content": "x", "timings": {"prompt_n": 3, "predicted_n": 2}, "tokens_cached": 1}
    assert project(body, ["content", "timings/prompt_n", "nope", "timings/x"]) == \
        {"content": "x", "timings/prompt_n": 3}
    assert project(body, None) is body
