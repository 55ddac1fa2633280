"""Constraints on the real SmolLM2 with llama.cpp's grammar engine: the model drafter and prompt lookup keep
drafting, every emitted token is one the grammar allows (the output parses), greedy output equals plain decoding
under the same constraint, and the logprobs come with every emitted token whatever the drafter.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from localspec.backend import Grammar, GrammarError, json_schema_grammar
from localspec.sampling.constrain import build_constraint
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import ModelDrafter, PromptLookup
from localspec.speculative.loop import generate
from localspec.tuning.fixed import FixedK

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok"],
          "properties": {"name": {"enum": ["alpha", "beta", "gamma"]}, "ok": {"type": "boolean"}}}
PROMPT = ('<|im_start|>user\nReply with JSON like {"name": "alpha", "ok": true}.<|im_end|>\n'
          '<|im_start|>assistant\n')


@pytest.fixture(scope="module")
def gbnf() -> str:
    return json_schema_grammar(SCHEMA)


def _run(target, drafter, params, k=4, max_tokens=48):
    toks = target.tokenize(PROMPT, add_special=True, parse_special=True)
    steps = list(generate(target, toks, drafter=drafter, controller=FixedK(k if drafter else 0), params=params,
                          max_tokens=max_tokens))
    out = [t for s in steps for t in s.tokens]
    return target.detokenize(out), steps


def test_grammar_states_and_errors(smollm2_target, gbnf):
    g = Grammar(smollm2_target, gbnf)
    first = smollm2_target.tokenize("{", add_special=False)[0]
    assert g.allows(first) and g.mask()[first] and g.mask().sum() < 10
    c = g.clone()
    c.accept(first)
    assert not c.allows(first) and g.allows(first)  # the clone moved on, the original did not
    with pytest.raises(GrammarError):
        Grammar(smollm2_target, "root ::= undefined-rule")
    with pytest.raises(GrammarError):
        json_schema_grammar({"type": "no-such-type"})


@pytest.mark.parametrize("drafter_kind", ["model", "lookup"])
def test_speculative_greedy_equals_plain_under_the_grammar(smollm2_target, smollm2_twin, gbnf, drafter_kind):
    drafter = ModelDrafter(smollm2_twin) if drafter_kind == "model" else PromptLookup()
    plain, _ = _run(smollm2_target, None,
                    SamplingParams(constraint=build_constraint(smollm2_target, grammar=gbnf)))
    spec, steps = _run(smollm2_target, drafter,
                       SamplingParams(constraint=build_constraint(smollm2_target, grammar=gbnf), logprobs=2))
    assert spec == plain
    obj = json.loads(spec)
    assert obj["name"] in ("alpha", "beta", "gamma") and isinstance(obj["ok"], bool)
    assert sum(s.drafted for s in steps) > 0 and sum(s.accepted for s in steps) > 0
    assert all(len(s.logprobs) == len(s.tokens) for s in steps)
    assert steps[-1].finish == "stop"


def test_sampled_output_always_follows_the_grammar(smollm2_target, smollm2_twin, gbnf):
    drafter = ModelDrafter(smollm2_twin)
    drafted = 0
    for seed in range(4):
        params = SamplingParams(temperature=1.0, seed=seed,
                                constraint=build_constraint(smollm2_target, grammar=gbnf,
                                                            logit_bias={smollm2_target.eos: -1.0}))
        text, steps = _run(smollm2_target, drafter, params, max_tokens=64)
        drafted += sum(s.drafted for s in steps)
        if steps[-1].finish == "stop":
            obj = json.loads(text)
            assert set(obj) == {"name", "ok"}
        else:  # out of tokens inside the object: still a prefix the grammar allows
            g = Grammar(smollm2_target, gbnf)
            for t in (t for s in steps for t in s.tokens):
                assert g.allows(t)
                g.accept(t)
    assert drafted > 0


def test_logit_bias_ban_holds_with_a_drafter(smollm2_target, smollm2_twin):
    toks = smollm2_target.tokenize("1, 2, 3, 4, 5, 6, 7, 8,", add_special=True)
    comma = smollm2_target.tokenize(",", add_special=False)[0]
    params = SamplingParams(constraint=build_constraint(smollm2_target, logit_bias={comma: -np.inf}))
    steps = list(generate(smollm2_target, toks, drafter=ModelDrafter(smollm2_twin), controller=FixedK(4),
                          params=params, max_tokens=16))
    assert comma not in [t for s in steps for t in s.tokens]
