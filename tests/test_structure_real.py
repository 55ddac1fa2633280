"""The structure drafter on real models and llama.cpp's grammars: one seed, one text with it on or off (greedy
and sampled, alone and over prompt lookup), the output is valid JSON for the schema, and most of what it
drafts is accepted (the forced text spelled in the model's own tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.backend import LoadOptions, Model, json_schema_grammar
from localspec.engine.toolgrammar import generic_instructions, generic_schema
from localspec.sampling.constrain import build_constraint
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.loop import generate
from localspec.speculative.structure import STRUCTURE, StructureDrafter
from localspec.tuning.controller import FixedK

TOOLS = [{"name": "get_weather", "description": "Current weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                         "required": ["city", "unit"]}},
         {"name": "get_forecast", "description": "Weather forecast for the next days",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city", "days"]}}]
CALL = generic_schema(TOOLS, required=True, parallel=False)
ASK = generic_instructions(TOOLS, required=True, parallel=False) + "\n\nWhat's the weather in Lisbon, in celsius?"
CHAT = {"smollm2": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        "gemma": "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"}


def _run(target: Model, structure: bool, params: SamplingParams, *, lookup: bool = False, prompt: str = ASK,
         chat: str = "smollm2", max_tokens: int = 64):
    """(text, steps) of one generation under CALL's grammar; the constraint is fresh for each."""
    grammar = json_schema_grammar(CALL)
    params = SamplingParams(**{**params.__dict__, "constraint": build_constraint(target, grammar=grammar)})
    drafter = StructureDrafter(target.piece, is_eog=target.is_eog,
                               fallback=PromptLookup() if lookup else None) if structure else None
    toks = target.tokenize(CHAT[chat].format(prompt), add_special=True, parse_special=True)
    steps = list(generate(target, toks, drafter=drafter, controller=FixedK(8 if structure else 0), params=params,
                          max_tokens=max_tokens))
    return target.detokenize([t for s in steps for t in s.tokens]), steps


def _accepted(steps) -> tuple[int, int]:
    mine = [s for s in steps if s.source == STRUCTURE]
    return sum(s.accepted for s in mine), sum(s.drafted for s in mine)


@pytest.mark.slow
@pytest.mark.parametrize("lookup", [False, True])
def test_greedy_text_is_plain_decoding_s_and_the_forced_text_is_accepted(smollm2_target, lookup):
    plain, _ = _run(smollm2_target, False, SamplingParams())
    spec, steps = _run(smollm2_target, True, SamplingParams(), lookup=lookup)
    assert spec == plain
    call = json.loads(spec)["tool_calls"][0]
    assert call["name"] in ("get_weather", "get_forecast")
    accepted, drafted = _accepted(steps)
    assert drafted > 0 and accepted >= 0.6 * drafted  # spelled as the model writes it, most of it is kept
    assert len(steps) < len(plain and [t for s in steps for t in s.tokens])  # fewer target passes than tokens


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_seed_same_sampled_text_with_structure_on_or_off(smollm2_target, seed):
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=seed)
    off, _ = _run(smollm2_target, False, params)
    on, steps = _run(smollm2_target, True, params, lookup=True)
    assert on == off
    assert sum(s.drafted for s in steps) > 0


@pytest.fixture(scope="module")
def gemma_target(gemma_path: Path):
    m = Model.load(gemma_path, LoadOptions(n_ctx=1024))
    yield m
    m.close()


@pytest.mark.slow
def test_gemma_same_text_greedy_and_sampled(gemma_target):
    for params in (SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=7)):
        off, _ = _run(gemma_target, False, params, chat="gemma", max_tokens=48)
        on, steps = _run(gemma_target, True, params, lookup=True, chat="gemma", max_tokens=48)
        assert on == off
        assert _accepted(steps)[1] > 0
