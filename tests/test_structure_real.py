"""The structure drafter on real models and llama.cpp's grammars: one seed, one text with it on or off (greedy
and sampled, up to the near ties of a batched verify's logits), the output is valid JSON for the schema, and
most of what it drafts is accepted (the forced text spelled in the model's own tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec.backend import LoadOptions, Model, json_schema_grammar
from localspec.bench.agreement import NEAR_TIE_LOGITS
from localspec.engine.toolgrammar import generic_instructions, generic_schema
from localspec.sampling.constrain import build_constraint
from localspec.sampling.params import SamplingParams
from localspec.sampling.warp import warp
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.loop import generate
from localspec.speculative.structure import STRUCTURE, StructureDrafter
from localspec.tuning.fixed import FixedK

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


def _same_text(target: Model, chat: str, off, on, params: SamplingParams = SamplingParams()) -> None:
    """The texts are the same, or part where a batched verify's logits, which differ slightly from a single
    decode's (docs/design.md, Numerics), can move the choice. Greedy: the target's own logits hold a near tie
    there. Sampled (one draw per token from the same seed): the draw landed near the boundary between two
    tokens, so both must be tokens the target's own row gives a real probability."""
    a, b = ([t for s in steps for t in s.tokens] for steps in (off, on))
    if a == b:
        return
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert i < min(len(a), len(b)), "one text stopped early"
    target.rewind(0)
    prompt = target.tokenize(CHAT[chat].format(ASK), add_special=True, parse_special=True)
    logits = target.decode(prompt + a[:i], 1)[0].astype(np.float64)
    texts = (target.detokenize(a), target.detokenize(b))
    if params.greedy:
        assert abs(logits[a[i]] - logits[b[i]]) < NEAR_TIE_LOGITS, texts
        return
    row = build_constraint(target, grammar=json_schema_grammar(CALL)).row(logits, prompt, a[:i], greedy=False)
    w = warp(row[None], params)  # the row as the sampler saw it: the grammar's mask, then the warps
    probs = dict(zip(np.asarray(w.ids).ravel().tolist(), np.asarray(w.probs).ravel().tolist()))
    for t in (a[i], b[i]):
        assert probs.get(t, 0.0) > SAMPLED_MIN_P, (texts, target.piece(t), probs.get(t, 0.0))


SAMPLED_MIN_P = 0.005  # far above float noise; a token the sampler could not have drawn has 0


@pytest.mark.slow
def test_greedy_text_is_plain_decoding_s_and_the_forced_text_is_accepted(smollm2_target):
    plain, off = _run(smollm2_target, False, SamplingParams())
    spec, on = _run(smollm2_target, True, SamplingParams(), lookup=True)
    _same_text(smollm2_target, "smollm2", off, on)
    call = json.loads(spec)["tool_calls"][0]
    assert call["name"] in ("get_weather", "get_forecast")
    accepted, drafted = _accepted(on)
    assert drafted > 0 and accepted >= 0.5 * drafted  # spelled as the model writes it, most of it is kept
    assert len(on) < 0.8 * len(off)  # fewer target passes than plain decoding's one per token


@pytest.mark.slow
def test_same_seed_same_sampled_text_with_structure_on_or_off(smollm2_target):
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=3)
    _, off = _run(smollm2_target, False, params)
    _, on = _run(smollm2_target, True, params)
    _same_text(smollm2_target, "smollm2", off, on, params)
    assert _accepted(on)[0] > 0


@pytest.fixture(scope="module")
def gemma_target(gemma_path: Path):
    m = Model.load(gemma_path, LoadOptions(n_ctx=1024))
    yield m
    m.close()


@pytest.mark.slow
def test_gemma_same_text_greedy_and_sampled(gemma_target):
    for params in (SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=7)):
        _, off = _run(gemma_target, False, params, chat="gemma", max_tokens=40)
        _, on = _run(gemma_target, True, params, lookup=True, chat="gemma", max_tokens=40)
        _same_text(gemma_target, "gemma", off, on, params)
        assert _accepted(on)[1] > 0
