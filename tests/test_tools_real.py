"""Tool calls on the real SmolLM2-135M with llama.cpp's grammar engine: when a call is required, the output is
a call in the template's own format whose arguments parse and fit the tool's schema, even from a model this
small. Its GGUF template has no tool syntax (Gemma-3-270M has no template): the generic format; the Hermes,
Llama 3.1 and Mistral templates of tests/templates/ stand in for models that have one.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from localspec.engine.engine import Engine
from localspec.engine.tools import detect_tool_format, plan_tools, template_context, tool_messages
from localspec.models.gguf_header import read_header
from localspec.sampling.constrain import build_constraint
from localspec.sampling.params import SamplingParams

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 20},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "required": ["zone"],
                   "properties": {"zone": {"type": "string", "maxLength": 12}}}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def _template(path: Path) -> str | None:
    return read_header(path, tokens=False).kv.get("tokenizer.chat_template")


def test_the_fixture_models_templates_have_no_tool_syntax(smollm2_path: Path, gemma_path: Path) -> None:
    """SmolLM2's template is plain ChatML; Gemma-3-270M is a base model with none: both the generic format."""
    smol = _template(smollm2_path)
    assert smol and "<|im_start|>" in smol and detect_tool_format(smol) == "generic"
    assert _template(gemma_path) is None and detect_tool_format(_template(gemma_path)) == "generic"


def _answer(engine: Engine, tools: list[dict], choice: object) -> tuple[str, str, list]:
    """Plan, render, generate under the plan's grammar (greedy) and parse: (format, content, calls)."""
    plan = plan_tools(engine.chat_template, tools, choice)
    assert plan is not None and plan.grammar is not None
    prompt = engine.chat_prompt(tool_messages(QUESTION, plan, engine.chat_template), **template_context(plan, tools))
    params = SamplingParams(constraint=build_constraint(engine.target, grammar=plan.grammar))
    text = "".join(c.text for c in engine.generate(prompt, params=params, max_tokens=96))
    content, calls = plan.parse(text)
    return plan.fmt, content, calls


def _fits(call, tools: list[dict]) -> None:
    (fn,) = [t["function"] for t in tools if t["function"]["name"] == call.name]
    jsonschema.validate(json.loads(call.arguments), fn["parameters"])


@pytest.mark.parametrize("template, fmt", [(None, "generic"), ("qwen2.5", "hermes"), ("llama-3.1", "llama3"),
                                           ("mistral-nemo", "mistral")])
def test_a_required_call_parses_and_fits_the_schema(smollm2_target, template: str | None, fmt: str) -> None:
    tpl = (TEMPLATES / f"{template}.jinja").read_text() if template else None
    engine = Engine(smollm2_target, None, chat_template=tpl)
    got_fmt, content, calls = _answer(engine, [WEATHER, TIME], "required")
    assert got_fmt == fmt and content.strip() == ""
    assert calls, "a required call was made"
    for call in calls:
        _fits(call, [WEATHER, TIME])


def test_a_named_function_is_the_one_called(smollm2_target) -> None:
    engine = Engine(smollm2_target, None)
    _, _, calls = _answer(engine, [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert [c.name for c in calls][:1] == ["get_time"]
    _fits(calls[0], [TIME])

