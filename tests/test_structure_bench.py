"""The bench's structured tasks: `tools` and `json-schema` prompts carry the grammar every configuration decodes
under, run only when named, and add the structure drafter's rows (alone and over prompt lookup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.bench.runner import AUTO, PLAIN, STRUCTURE_LOOKUP, Config, Plan, TargetSpec, configs_for, row_config
from localspec.bench.tasks import STRUCTURED, BenchInputError, builtin_prompts, parse_jsonl, select
from localspec.models import LOOKUP
from localspec.speculative.structure import STRUCTURE
from localspec.speculative.types import NO_DRAFTER

TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}}


def test_a_tools_prompt_gets_the_generic_instructions_and_a_required_call_schema():
    [p] = parse_jsonl([json.dumps({"task": "tools", "tools": [TOOL], "prompt": "Weather in Oslo?"})], "t")
    assert p.prompt.startswith("You can call these tools:") and p.prompt.endswith("Weather in Oslo?")
    schema = json.loads(p.schema or "")
    call = schema["properties"]["tool_calls"]
    assert schema["required"] == ["tool_calls"] and call["maxItems"] == 1
    assert call["items"]["properties"]["name"] == {"const": "get_weather"}


def test_a_schema_prompt_keeps_its_text_and_bad_structure_is_refused():
    [p] = parse_jsonl([json.dumps({"task": "x", "schema": {"type": "object"}, "prompt": "Hi"})], "t")
    assert p.prompt == "Hi" and json.loads(p.schema or "") == {"type": "object"}
    with pytest.raises(BenchInputError, match="schema"):
        parse_jsonl([json.dumps({"task": "x", "schema": [1], "prompt": "Hi"})], "t")
    with pytest.raises(BenchInputError, match="tools"):
        parse_jsonl([json.dumps({"task": "x", "tools": [{"no": "name"}], "prompt": "Hi"})], "t")


def test_structured_tasks_run_only_when_named():
    prompts = builtin_prompts()
    assert set(STRUCTURED) <= {p.task for p in prompts}
    assert all(p.schema for p in prompts if p.task in STRUCTURED)
    assert not {p.task for p in select(prompts)} & set(STRUCTURED)  # the default bench is unchanged
    named = select(prompts, ["tools", "json-schema"], 1)
    assert [p.task for p in named] == ["tools", "json-schema"]


def test_a_grammar_adds_the_structure_rows():
    target = TargetSpec("t", Path("t.gguf"))
    plain = [p for p in builtin_prompts() if p.task == "chat"][:1]
    tools = [p for p in builtin_prompts() if p.task == "tools"][:1]
    assert [c.drafter for c in configs_for(target, Plan((target,), tuple(plain), ks=(4,)))] == [PLAIN, LOOKUP]
    plan = Plan((target,), tuple(tools), ks=(4,), auto=True)
    names = [c.name for c in configs_for(target, plan)]
    assert names == ["plain", "lookup k=4", "lookup k=auto", "structure k=4", "structure k=auto",
                     "structure+lookup k=4", "structure+lookup k=auto"]
    alone, both = row_config(Config(STRUCTURE, 4), plan), row_config(Config(STRUCTURE_LOOKUP, AUTO), plan)
    assert alone.structure and alone.draft == NO_DRAFTER and alone.k == 4 and not alone.adaptive
    assert both.structure and both.draft == LOOKUP and both.adaptive
    assert not row_config(Config(LOOKUP, 4), plan).structure

