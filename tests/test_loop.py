"""The speculative loop with scripted fake target and drafter: outputs and KV positions, round by round."""

from __future__ import annotations

import numpy as np
from fakes import EOS, FakeModel, counting

from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import ModelDrafter
from localspec.speculative.loop import MERGE_MAX, generate
from localspec.speculative.types import Draft
from localspec.tuning.fixed import FixedK


class Scripted:
    """A drafter that proposes fixed tokens and records the contexts it saw."""

    name = "scripted"
    sources = ("scripted",)
    cost = {"scripted": 0.0}
    prior: dict = {}

    def __init__(self, proposals):
        self.proposals = proposals
        self.seen = []

    def propose(self, context, k_for, params, rng):
        k = k_for(self.name)
        self.seen.append((list(context), k))
        return Draft(tuple(self.proposals(context)[:k]), None, "scripted")

    def close(self):
        pass


def _run(target, prompt, **kw):
    steps, context = [], list(prompt)
    for s in generate(target, prompt, **kw):
        steps.append(s)
        context.extend(s.tokens)
        if not s.finish:  # between rounds the target cache holds exactly context[:-1]
            assert target.tokens == context[:-1]
    return steps, context


def test_all_drafts_accepted_bonus_token_and_drafter_fed_last_draft():
    target = FakeModel(counting())
    draft_model = FakeModel(counting())
    steps, out = _run(target, [1, 2, 3], drafter=ModelDrafter(draft_model), controller=FixedK(4), max_tokens=10)
    assert out == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert [(s.drafted, s.accepted, len(s.tokens)) for s in steps] == [(4, 4, 5), (4, 4, 5)]
    # round 1: drafter prefilled the prompt, then decoded d1..d3 (d4 is never decoded in the round)
    assert draft_model.calls[:4] == [([1, 2, 3], 1), ([4], 1), ([5], 1), ([6], 1)]
    # round 2: the drafter's cache lacked the last draft (7) and the bonus (8): it decodes exactly those
    assert draft_model.calls[4] == ([7, 8], 1)
    # the target verified [last, d1..d4] with exactly k+1 logit rows, never more; in round 1 the prompt's short
    # tail [1, 2] shared that pass (MERGE_MAX), still with k+1 rows of logits
    assert target.calls[0] == ([1, 2, 3, 4, 5, 6, 7], 5)
    assert target.calls[1] == ([8, 9, 10, 11, 12], 5)
    # the time to its first draft token is timed apart, inside the round's drafting time (tuning/round_cost.py)
    assert all(0 < s.t_first <= s.t_draft for s in steps)
    assert steps[-1].finish == "length"


def test_a_long_prompt_tail_gets_its_own_pass_a_short_one_shares_the_first_verify_pass():
    for n, calls in [(MERGE_MAX + 1, [(list(range(1, MERGE_MAX + 2)), 1)]),
                     (MERGE_MAX + 2, [(list(range(1, MERGE_MAX + 2)), 0), ([MERGE_MAX + 2], 1)])]:
        target = FakeModel(counting())
        steps, out = _run(target, list(range(1, n + 1)), max_tokens=1)
        assert out == list(range(1, n + 2)) and target.calls == calls
        merged = n - 1 <= MERGE_MAX
        assert steps[0].n_prompt == n and (steps[0].t_verify == 0) == merged  # a shared pass is prompt time


def test_prefill_reports_the_reused_prefix_then_each_batch():
    target = FakeModel(counting())
    _run(target, list(range(1, 22)), max_tokens=1)  # the cache keeps 1..21
    heard: list[int] = []
    _, out = _run(target, list(range(1, 41)), max_tokens=1, progress=heard.append, batch=8)
    assert heard == [21, 29, 37, 39] and out == list(range(1, 42))  # the prefix, then each batch of 22..39
    assert target.calls[-4:] == [(list(range(22, 30)), 0), (list(range(30, 38)), 0), ([38, 39], 0), ([40], 1)]


def test_first_draft_rejected_emits_target_token():
    target = FakeModel(counting())
    drafter = Scripted(lambda ctx: [40, 41, 42])
    steps, out = _run(target, [1, 2], drafter=drafter, controller=FixedK(3), max_tokens=4)
    assert out == [1, 2, 3, 4, 5, 6]
    assert all(s.accepted == 0 and len(s.tokens) == 1 for s in steps)
    assert [s.drafted for s in steps] == [3, 2, 1, 0]  # k shrinks so a round never overshoots max_tokens


def test_partial_acceptance_rewinds_rejected_drafts():
    target = FakeModel(counting())
    drafter = Scripted(lambda ctx: [ctx[-1] + 1, ctx[-1] + 2, 99, 98])
    steps, out = _run(target, [1], drafter=drafter, controller=FixedK(4), max_tokens=6)
    assert out == [1, 2, 3, 4, 5, 6, 7]
    assert [(s.accepted, s.tokens) for s in steps] == [(2, (2, 3, 4)), (2, (5, 6, 7))]


def test_eos_inside_draft_stops_and_drops_what_follows():
    target = FakeModel(lambda ctx: EOS if ctx[-1] == 5 else ctx[-1] + 1)
    drafter = Scripted(lambda ctx: [ctx[-1] + 1, ctx[-1] + 2, EOS, 33])
    steps, out = _run(target, [2], drafter=drafter, controller=FixedK(4), max_tokens=50)
    assert out == [2, 3, 4, 5]  # EOS itself is not emitted; 33 after it is dropped
    assert steps[-1].finish == "stop"
    assert target.tokens == [2, 3, 4]  # cache rolled back to context[:-1] when the generator ended


def test_draft_is_cut_after_its_first_eos():
    # nothing after an end-of-generation token can be emitted: the target never verifies it (a copy from the
    # prompt that runs into the chat template), and the output is what the whole draft would have given
    target = FakeModel(lambda ctx: EOS if ctx[-1] == 4 else ctx[-1] + 1)
    drafter = Scripted(lambda ctx: [ctx[-1] + 1, ctx[-1] + 2, EOS, 33, 34, 35])
    steps, out = _run(target, [2], drafter=drafter, controller=FixedK(6), max_tokens=50)
    assert out == [2, 3, 4]
    assert target.calls[-1] == ([2, 3, 4, EOS], 4)  # [last, d1, d2, EOS]: 4 rows, not 7
    assert [(s.drafted, s.accepted, s.finish) for s in steps] == [(3, 3, "stop")]
    # a first draft token that ends generation is verified alone; the rest goes
    target = FakeModel(lambda ctx: EOS)
    steps, out = _run(target, [2], drafter=Scripted(lambda ctx: [EOS, 7, 8]), controller=FixedK(3), max_tokens=5)
    assert out == [2] and target.calls[-1] == ([2, EOS], 2) and steps[0].accepted == 1


def test_max_tokens_inside_a_draft():
    target = FakeModel(counting())
    drafter = ModelDrafter(FakeModel(counting()))
    steps, out = _run(target, [1], drafter=drafter, controller=FixedK(4), max_tokens=7)
    assert len(out) - 1 == 7
    assert [s.drafted for s in steps] == [4, 1]  # the last round drafts only what the budget allows
    assert steps[-1].finish == "length"


def test_context_full_stops_cleanly():
    target = FakeModel(counting(), n_ctx=10)
    drafter = ModelDrafter(FakeModel(counting(), n_ctx=10))
    steps, out = _run(target, [1, 2, 3], drafter=drafter, controller=FixedK(4), max_tokens=100)
    assert steps[-1].finish == "context"
    assert out == list(range(1, len(out) + 1))
    assert len(out) == 11  # 10 positions in the cache + the pending last token
    assert max(len(c[0]) + n for c, n in [(c, 0) for c in target.calls]) <= 10


def test_closing_the_generator_leaves_cache_consistent():
    target = FakeModel(counting())
    gen = generate(target, [1, 2], drafter=Scripted(lambda ctx: [ctx[-1] + 1, 77]), controller=FixedK(2), max_tokens=50)
    ctx = [1, 2]
    for _ in range(3):
        ctx.extend(next(gen).tokens)
    gen.close()
    assert target.tokens == ctx[:-1]


def test_plain_decoding_without_drafter():
    target = FakeModel(counting())
    steps, out = _run(target, [1], max_tokens=5)
    assert out == [1, 2, 3, 4, 5, 6]
    assert all(s.drafted == 0 and len(s.tokens) == 1 for s in steps)
    assert all(rows == 1 for _, rows in target.calls[1:])


def test_sampling_path_with_certain_target_is_exact():
    """At T>0 with a (near-)one-hot target, output equals the target's choice whatever the drafter says."""
    target = FakeModel(counting())
    drafter = ModelDrafter(FakeModel(lambda ctx: 7))
    steps, out = _run(target, [1], drafter=drafter, controller=FixedK(3), max_tokens=8,
                      params=SamplingParams(temperature=0.5, seed=1), rng=np.random.default_rng(1))
    assert out == list(range(1, 10))


def test_prompt_prefix_is_reused_across_requests():
    target = FakeModel(counting())
    list(generate(target, [1, 2, 3, 4, 5], max_tokens=2))
    steps = list(generate(target, [1, 2, 3, 9, 10], max_tokens=1))
    assert (steps[0].n_cached, steps[0].n_prompt) == (3, 2)


def test_recurrent_target_and_drafter_give_plain_text_and_replay_only_accepted_tokens():
    """A memory that cannot cut in place (a recurrent state) goes back to its checkpoints: the text is plain
    decoding's, the cache holds context[:-1] after every round, and a rejection decodes again exactly the
    round's accepted tokens after the checkpoint taken before the pass."""
    wrong_every_third = lambda ctx: [t if i % 3 != 2 else EOS + 47 for i, t in  # noqa: E731
                                     enumerate(counting()(ctx + list(range(50))[:j]) for j in range(8))]
    plain, _ = _run(FakeModel(counting()), [1, 2, 3], max_tokens=20)
    target = FakeModel(counting(), recurrent=True)
    draft_model = FakeModel(counting(), recurrent=True)
    spec, out = _run(target, [1, 2, 3], drafter=ModelDrafter(draft_model), controller=FixedK(4), max_tokens=20)
    assert out == [1, 2, 3] + [t for s in plain for t in s.tokens]
    assert target.replayed == 0  # the drafter always agrees: nothing rejected, nothing decoded again
    scripted = Scripted(wrong_every_third)
    target = FakeModel(counting(), recurrent=True)
    steps, out2 = _run(target, [1, 2, 3], drafter=scripted, controller=FixedK(4), max_tokens=20)
    assert out2 == out
    rejected = [s for s in steps if s.accepted < s.drafted]
    assert rejected and target.replayed == sum(s.accepted + 1 for s in rejected)
    assert target.calls[0] == ([1, 2], 0)  # the prompt's tail had a pass of its own: a checkpoint at its end
    assert target.checkpoints["prompt"] == 2
