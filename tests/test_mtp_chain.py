"""Chained MTP heads: a tiny step35 with three heads (tests/tiny_step35.py), where draft position i is head i's.
Drafting with them changes no token (greedy text is plain decoding's, a seed gives plain decoding's sampled text,
a request after another gives a fresh start's), a draft has at most one token per head, and each head's logits
after a generation of drafts and rollbacks equal those of a head whose cache no other head ever shared: the
heads' layers share one KV cache in llama.cpp's scheme (backend/mtp_chain.py), so this is the check that running
one head does not spoil another's rows. The round-by-round comparison with llama.cpp is in test_mtp_llamacpp.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import CACHE
from drafting import NEAR_TIE
from drafting import run_fixed as _run
from tiny_step35 import HEADS, file_name, write_step35

from localspec.backend import LoadOptions, Model
from localspec.backend.mtp import MtpHead, _get_embeddings_nextn_ith, _rows, measure_cost, nextn_layers
from localspec.backend.mtp_chain import ChainedMtpHead, _set_nextn_layer_offset, open_head
from localspec.models.nextn import nextn_heads
from localspec.sampling.params import SamplingParams
from localspec.speculative.mtp import MTP, MtpDrafter

OPTIONS = LoadOptions(n_ctx=512, mtp=True)
PROMPT = "Write a short story about a robot who learns to paint."


def _fixture(smollm2_path: Path, echo: float | None = None) -> Path:
    out = CACHE / "fixtures" / file_name(echo)
    return out if out.exists() else write_step35(smollm2_path, out, echo=echo)


def _load(path: Path, options: LoadOptions = OPTIONS) -> Model:
    m = Model.load(path, options)
    m.set_threads(1, 1)  # tiny models on a busy 2-core machine: a second thread only waits for a core
    return m


@pytest.fixture(scope="module")
def step35_path(smollm2_path: Path) -> Path:
    return _fixture(smollm2_path)


@pytest.fixture(scope="module")
def target(step35_path: Path):
    m = _load(step35_path)
    yield m
    m.close()


@pytest.fixture(scope="module")
def reference(step35_path: Path):
    m = _load(step35_path, replace(OPTIONS, mtp=False))
    yield m
    m.close()


@pytest.fixture
def drafter(target: Model):
    d = MtpDrafter(open_head(target))
    yield d
    d.close()


def test_the_file_carries_its_heads_and_gets_the_chained_driver(step35_path: Path, target: Model,
                                                                drafter: MtpDrafter):
    assert nextn_heads(step35_path) == nextn_layers(target) == HEADS > 1
    assert isinstance(drafter.head, ChainedMtpHead) and drafter.head.max_draft == HEADS


def test_greedy_is_plain_decoding_and_drafts_stop_at_the_head_count(target: Model, reference: Model,
                                                                    drafter: MtpDrafter):
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt)
    spec, steps = _run(target, prompt, drafter, k=4)
    assert max(s.drafted for s in steps) == HEADS and {s.source for s in steps if s.drafted} == {MTP}
    assert spec == plain


@pytest.mark.parametrize("k", [1, 2])
def test_sampled_same_seed_same_text(target: Model, reference: Model, drafter: MtpDrafter, k: int):
    params = SamplingParams(temperature=0.9, seed=11)
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt, params=params)
    spec, steps = _run(target, prompt, drafter, k=k, params=params)
    assert sum(s.drafted for s in steps) > 0
    assert spec == plain


def test_prompt_reuse_is_a_fresh_start(target: Model, reference: Model, drafter: MtpDrafter):
    a = target.tokenize(PROMPT, add_special=True)
    answer, _ = _run(target, a, drafter, k=2, n=12)
    follow_up = a + answer + target.tokenize(" Then what?", add_special=False)
    again, steps = _run(target, follow_up, drafter, k=2, n=20, fresh=False)
    assert steps[0].n_cached > 0
    plain, _ = _run(reference, follow_up, n=20)
    assert again == plain


@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_the_echo_heads_drafts_are_accepted_as_they_agree(smollm2_path: Path, noise: float):
    """Heads that predict what the trunk will have every draft accepted, at every position; with noise, some;
    greedy or sampled, the text is plain decoding's."""
    path = _fixture(smollm2_path, echo=noise)
    target, reference = _load(path), _load(path, replace(OPTIONS, mtp=False))
    d = MtpDrafter(open_head(target))
    try:
        prompt = target.tokenize(PROMPT, add_special=True)
        plain, _ = _run(reference, prompt)
        spec, steps = _run(target, prompt, d, k=2)
        drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
        assert spec == plain
        if noise == 0:
            assert drafted > 0 and accepted == drafted
        else:
            assert 0 < accepted < drafted
        params = SamplingParams(temperature=0.7, seed=5)  # sampled: the coupled picks agree where the heads do
        plain, _ = _run(reference, prompt, params=params)
        spec, steps = _run(target, prompt, d, k=HEADS, params=params)
        assert spec == plain
        # at noise 0, not every draft: the heads' logits equal the trunk's within ~1e-2 (a norm applied twice), and
        # at T 0.7 these rows are near flat over 49152 tokens, so a pick can change (26 of 41 accepted here)
        if noise == 0:
            assert max(s.accepted for s in steps) == HEADS
    finally:
        d.close()
        target.close()
        reference.close()


def _lone_head(path: Path, context: list[int], head: int,
               chain: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Head `head`'s logits and hidden state for the chain's last row after `context[:-1]`, from an MTP context that
    only this head ever used: its pairs decoded with the offset set once, the chain's last row in a batch of its
    own (so its state is the batch's only row: no question which row llama.cpp hands back)."""
    t = _load(path)
    h = MtpHead(t)  # the single-head driver: it never changes the offset
    try:
        t.decode(context[:-1], 0)
        _set_nextn_layer_offset(h._ctx, head)
        n = len(context)
        h._catch_up(context[:n - 1], 0)
        if len(chain) > 1:
            h._decode([tok for tok, _ in chain[:-1]], [v for _, v in chain[:-1]], n - 1, out=False)
        h._decode([chain[-1][0]], [chain[-1][1]], n - 1 + len(chain) - 1, out=True)
        state = _rows(_get_embeddings_nextn_ith(h._ctx, h._last), 1, h.n_embd)[0].astype(np.float64)
        return np.array(h._logits(), dtype=np.float64), state
    finally:
        h.close()
        t.close()


def test_each_heads_cache_follows_the_accepted_context(step35_path: Path, target: Model, drafter: MtpDrafter):
    """After rounds of drafts and rollbacks, every head's logits for its draft step are those of a head that never
    shared its cache with another: running one head over the context left the others' rows as they were, and the
    state each step hands on is its chain's last row (read from a batch of several rows from step 1 on)."""
    prompt = target.tokenize(PROMPT, add_special=True)
    out, _ = _run(target, prompt, drafter, k=HEADS, n=30)
    context = prompt + out
    head: ChainedMtpHead = drafter.head  # type: ignore[assignment]
    target.restore(len(context) - 1)
    rows = [np.array(head.start(context), dtype=np.float64)]
    drafted = [int(np.argmax(rows[0]))]
    for _ in range(1, HEADS):
        rows.append(np.array(head.step(drafted[-1]), dtype=np.float64))
        drafted.append(int(np.argmax(rows[-1])))
    chain = [(tok, h.copy()) for tok, h in zip([context[-1], *drafted], head._chain_h)]
    head.finish()
    for i, row in enumerate(rows):
        logits, state = _lone_head(step35_path, context, i, chain[:i + 1])
        assert np.abs(row - logits).max() < NEAR_TIE, f"head {i}"
        if i + 1 < len(chain):  # the state step i handed on is its last row's
            assert np.abs(chain[i + 1][1] - state).max() < NEAR_TIE, f"head {i}'s state"
    assert np.abs(rows[0] - rows[1]).max() > 0.01  # the heads differ: the second is not the first again


def test_the_controller_plans_no_draft_longer_than_the_heads(step35_path: Path, drafter: MtpDrafter):
    """γ's range stops at the head count, so the controller prices only drafts the heads can make; a pinned
    longer k is cut to it as well."""
    from localspec.engine.loader import EngineConfig, _k_range

    assert drafter.max_k == HEADS
    assert _k_range(EngineConfig(model=str(step35_path)), drafter) == (1, HEADS)
    assert _k_range(EngineConfig(model=str(step35_path), k=8), drafter) == (HEADS, HEADS)


def test_cost_is_measured(drafter: MtpDrafter):
    c = measure_cost(drafter.head)  # type: ignore[arg-type]
    assert c is not None and c > 0


def test_a_single_head_file_keeps_the_single_head_driver(smollm2_path: Path):
    from tiny_gguf import file_name as qwen35_name
    from tiny_gguf import write_tiny

    path = CACHE / "fixtures" / qwen35_name("qwen35")
    if not path.exists():
        write_tiny("qwen35", smollm2_path, path)
    t = _load(path)
    head = open_head(t)
    try:
        assert type(head) is MtpHead and head.max_draft is None
    finally:
        head.close()
        t.close()


@pytest.mark.slow
def test_run_drafts_with_the_chained_heads_and_keeps_the_text(smollm2_path: Path):
    """`run` on the file drafts with its heads when no drafter is named; its text is `--no-spec`'s."""
    from click.testing import CliRunner

    from localspec.cli import main

    path = _fixture(smollm2_path, echo=1.0)

    def run(*flags: str) -> dict:
        r = CliRunner().invoke(main, ["run", "--model", str(path), *flags, "-n", "16", "--temp", "0", "--ctx", "512",
                                      "--threads", "1", "--json", PROMPT])
        assert r.exit_code == 0, r.output
        return json.loads(r.output.strip().splitlines()[-1])

    spec, plain = run("-k", "2", "--no-adaptive"), run("--no-spec")
    assert spec["drafter"] == MTP and spec["by_source"][MTP]["draft_n"] > 0
    assert plain["mode"] == "plain" and spec["text"] == plain["text"]
