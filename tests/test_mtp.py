"""The drafter inside the model: a tiny random-weight Qwen3.5 (hybrid: gated delta-net + attention) with one MTP
head (tests/tiny_gguf.py). Drafting with the head changes no token: greedy text is plain decoding's, a seed gives
one text, a request after another gives a fresh start's; the head's cache follows the accepted context exactly
(its logits after a generation are a fresh head's on the same context); the hybrid rollback stays what it was.
The loader makes the head the default drafter of such a file, `--draft mtp` forces it and `--no-spec` leaves it.

The random head's drafts are all rejected, which puts the rollback to work; a second fixture (the "echo": a bigram
trunk and a head that passes the token on, tiny_gguf.write_qwen35_echo) gets every draft accepted, or, with noise in
its head, some: there the accepted path runs, and the counts are checked."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import CACHE
from drafting import NEAR_TIE
from drafting import run_fixed as _run
from drafting import same_or_near_tie as _same_or_near_tie
from tiny_gguf import VERSION, file_name, write_qwen35_echo, write_tiny

from localspec.backend import LoadOptions, Model
from localspec.backend.mtp import MtpHead, measure_cost, nextn_layers
from localspec.errors import IncompatibleDrafter
from localspec.models.nextn import nextn_heads
from localspec.sampling.params import SamplingParams
from localspec.speculative.mtp import MTP, MtpDrafter
from localspec.speculative.types import NO_DRAFTER

OPTIONS = LoadOptions(n_ctx=512, mtp=True)
PROMPT = "Write a short story about a robot who learns to paint."


@pytest.fixture(scope="session")
def qwen35_path(smollm2_path: Path) -> Path:
    out = CACHE / "fixtures" / file_name("qwen35")
    if not out.exists():
        write_tiny("qwen35", smollm2_path, out)
    return out


def _load(path: Path, options: LoadOptions) -> Model:
    """One thread: these models are tiny, and on a busy 2-core machine a second thread only waits for a core."""
    m = Model.load(path, options)
    m.set_threads(1, 1)
    return m


@pytest.fixture(scope="module", params=[0.0, 1.0], ids=["agrees", "noisy"])
def echo(request: pytest.FixtureRequest, smollm2_path: Path):
    """(noise, target with its head, reference without) of the echo fixture at that noise."""
    out = CACHE / "fixtures" / f"tiny-qwen35-echo-v{VERSION}-{request.param}.gguf"
    if not out.exists():
        write_qwen35_echo(smollm2_path, out, noise=request.param)
    t, r = _load(out, OPTIONS), _load(out, replace(OPTIONS, mtp=False))
    yield request.param, t, r
    t.close()
    r.close()


@pytest.fixture(scope="module")
def target(qwen35_path: Path):
    m = _load(qwen35_path, OPTIONS)
    yield m
    m.close()


@pytest.fixture(scope="module")
def reference(qwen35_path: Path):
    """A second copy without the head: plain decoding's text and logits from an empty state."""
    m = _load(qwen35_path, replace(OPTIONS, mtp=False))
    yield m
    m.close()


@pytest.fixture
def drafter(target: Model):
    d = MtpDrafter(MtpHead(target))
    yield d
    d.close()


def test_the_file_carries_one_head_and_loads_it(qwen35_path: Path, target: Model):
    assert nextn_heads(qwen35_path) == 1
    assert nextn_layers(target) == 1
    assert target.memory_kind == "hybrid"


def test_a_model_loaded_without_its_heads_is_refused(reference: Model):
    with pytest.raises(ValueError, match="without its MTP heads"):
        MtpHead(reference)


def test_greedy_mtp_is_plain_decoding(target: Model, reference: Model, drafter: MtpDrafter):
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt)
    spec, steps = _run(target, prompt, drafter, k=3)
    assert sum(s.drafted for s in steps) > 0 and {s.source for s in steps if s.drafted} == {MTP}
    _same_or_near_tie(reference, prompt, plain, spec)


@pytest.mark.parametrize("k", [1, 4])
def test_sampled_same_seed_same_text(target: Model, reference: Model, drafter: MtpDrafter, k: int):
    params = SamplingParams(temperature=0.9, seed=11)
    prompt = target.tokenize(PROMPT, add_special=True)
    plain, _ = _run(reference, prompt, params=params)
    spec, steps = _run(target, prompt, drafter, k=k, params=params)
    assert sum(s.drafted for s in steps) > 0
    assert spec == plain


def test_the_echo_heads_drafts_are_accepted_as_they_agree(echo):
    """A head that predicts what its trunk will has every draft accepted; with noise in it, some: both give plain
    decoding's text, greedy and sampled."""
    noise, target, reference = echo
    d = MtpDrafter(MtpHead(target))
    try:
        prompt = target.tokenize(PROMPT, add_special=True)
        for params in (SamplingParams(), SamplingParams(temperature=0.8, seed=5)):
            plain, _ = _run(reference, prompt, params=params)
            spec, steps = _run(target, prompt, d, k=4, params=params)
            assert spec == plain
            drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
            if not params.greedy:  # near-uniform rows: logits ~0.01 apart move where a uniform falls
                assert accepted > 0
            elif noise == 0.0:
                assert accepted == drafted > 0
            else:
                assert 0 < accepted < drafted
    finally:
        d.close()


def test_the_heads_cache_follows_the_accepted_context(qwen35_path: Path, target: Model, drafter: MtpDrafter):
    """After rounds of drafts, rejections and rollbacks, the head drafts from what a fresh head on a fresh target
    that decoded only the final context drafts from: nothing of a rejected draft stays in its cache."""
    prompt = target.tokenize(PROMPT, add_special=True)
    out, _ = _run(target, prompt, drafter, k=4, n=30)
    context = prompt + out
    head: MtpHead = drafter.head  # type: ignore[assignment]
    target.restore(len(context) - 1)
    got = np.array(head.start(context), dtype=np.float64)
    head.finish()
    fresh_target = _load(qwen35_path, OPTIONS)
    fresh = MtpHead(fresh_target)
    try:
        fresh_target.decode(context[:-1], 0)
        want = np.array(fresh.start(context), dtype=np.float64)
        fresh.finish()
    finally:
        fresh.close()
        fresh_target.close()
    assert np.abs(got - want).max() < NEAR_TIE


def test_prompt_reuse_is_a_fresh_start(target: Model, reference: Model, drafter: MtpDrafter):
    """A follow-up request reuses the cache (the target's and the head's) and gives a fresh start's text."""
    a = target.tokenize(PROMPT, add_special=True)
    answer, _ = _run(target, a, drafter, k=3, n=12)
    follow_up = a + answer + target.tokenize(" Then what?", add_special=False)
    again, steps = _run(target, follow_up, drafter, k=3, n=20, fresh=False)
    assert steps[0].n_cached > 0
    plain, _ = _run(reference, follow_up, n=20)
    _same_or_near_tie(reference, follow_up, plain, again)


def test_hybrid_rollback_is_kept(target: Model, drafter: MtpDrafter):
    """The head changes nothing of how the hybrid target rewinds: rejected drafts were rolled back by the
    method chosen at load, and the target's cache holds exactly the emitted context afterwards."""
    method = target.rollback_info.method
    prompt = target.tokenize(PROMPT, add_special=True)
    out, steps = _run(target, prompt, drafter, k=4, n=30)
    assert any(s.accepted < s.drafted for s in steps)
    assert target.rollback_info.method == method
    assert target.tokens == (prompt + out)[:len(target.tokens)]


def test_cost_is_measured(target: Model, drafter: MtpDrafter):
    c = measure_cost(drafter.head)  # type: ignore[arg-type]
    assert c is not None and c > 0


class _FakeHead:
    """Logits that put the maximum on (the last token fed + 1), and a record of the calls."""

    def __init__(self, n_vocab: int = 50, fail_at: int = -1) -> None:
        self.n_vocab, self.fail_at, self.calls = n_vocab, fail_at, []

    def _row(self, token: int) -> np.ndarray:
        row = np.zeros(self.n_vocab, dtype=np.float32)
        row[(token + 1) % self.n_vocab] = 5.0
        return row

    def start(self, context):
        self.calls.append("start")
        return self._row(context[-1])

    def step(self, token):
        self.calls.append("step")
        if len(self.calls) - 1 == self.fail_at:
            raise RuntimeError("decode failed")
        return self._row(token)

    def finish(self):
        self.calls.append("finish")

    def close(self):
        pass


def test_the_drafter_takes_the_heads_argmax_and_always_finishes():
    head = _FakeHead()
    d = MtpDrafter(head)
    draft = d.propose([3, 4, 5], lambda s: 3 if s == MTP else 0, SamplingParams(), np.random.default_rng(0))
    assert draft.tokens == (6, 7, 8) and draft.source == MTP and draft.probs is None
    assert head.calls == ["start", "step", "step", "finish"]
    failing = _FakeHead(fail_at=2)
    with pytest.raises(RuntimeError):
        MtpDrafter(failing).propose([3], lambda s: 4, SamplingParams(), np.random.default_rng(0))
    assert failing.calls[-1] == "finish"


@pytest.mark.slow
def test_loader_defaults_to_the_heads_and_obeys_the_flags(qwen35_path: Path, smollm2_path: Path):
    from localspec.engine.loader import EngineConfig, load_engine

    quiet = {"log": lambda *a: None}
    base = EngineConfig(model=str(qwen35_path), n_ctx=512, threads=1)
    engine = load_engine(base, **quiet)
    try:
        assert engine.drafter_name == MTP and engine.target.options.mtp
        c = engine.controller.state().c.get(MTP) if engine.controller else None
        assert c is not None and c > 0
    finally:
        engine.close()
    engine = load_engine(replace(base, draft=NO_DRAFTER), **quiet)
    try:
        assert engine.drafter is None and not engine.target.options.mtp
    finally:
        engine.close()
    with pytest.raises(IncompatibleDrafter, match="no MTP heads"):
        load_engine(EngineConfig(model=str(smollm2_path), draft=MTP, n_ctx=512, threads=1), **quiet)


@pytest.mark.slow
def test_models_show_counts_the_heads(qwen35_path: Path, smollm2_path: Path):
    from click.testing import CliRunner

    from localspec.cli import main

    r = CliRunner().invoke(main, ["models", "show", str(qwen35_path), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mtp_heads"] == 1
    assert "mtp heads: 1 (the default drafter" in CliRunner().invoke(main, ["models", "show", str(qwen35_path)]).output
    assert "mtp heads: none" in CliRunner().invoke(main, ["models", "show", str(smollm2_path)]).output


@pytest.mark.slow
def test_run_labels_the_heads_and_keeps_the_text(qwen35_path: Path):
    """`run` drafts with the heads when no drafter is named and says so; its text is `--no-spec`'s."""
    from click.testing import CliRunner

    from localspec.cli import main

    def run(*flags: str) -> dict:
        r = CliRunner().invoke(main, ["run", "--model", str(qwen35_path), *flags, "-n", "16", "--temp", "0",
                                      "--ctx", "512", "--threads", "1", "--json", PROMPT])
        assert r.exit_code == 0, r.output
        return json.loads(r.output.strip().splitlines()[-1])

    spec, plain = run("-k", "3", "--no-adaptive"), run("--no-spec")
    assert spec["drafter"] == MTP and spec["mode"] == "spec" and spec["by_source"][MTP]["draft_n"] > 0
    assert plain["mode"] == "plain" and spec["text"] == plain["text"]


@pytest.mark.slow
def test_server_labels_the_heads_and_a_request_after_another_is_a_fresh_servers_answer(qwen35_path: Path):
    """The server says its drafter is `mtp` (/props, each answer's `speculative` block); B after A on one server
    gives B's answer on a fresh server: the head's cache follows the new prompt."""
    import httpx
    from servers import ServerProcess

    a = {"prompt": PROMPT + " Then the dog woke up.", "n_predict": 16, "temperature": 0}
    b = {"prompt": PROMPT + " But the cat was asleep.", "n_predict": 16, "temperature": 0}
    args = ["--model", str(qwen35_path), "--ctx", "512", "-k", "3", "--no-adaptive", "--threads", "1"]
    with ServerProcess(args) as srv:
        assert httpx.get(srv.url + "/props", timeout=60).json()["drafter"] == MTP
        first = httpx.post(srv.url + "/completion", json=a, timeout=120).json()
        after = httpx.post(srv.url + "/completion", json=b, timeout=120).json()
    with ServerProcess(args) as srv:
        fresh = httpx.post(srv.url + "/completion", json=b, timeout=120).json()
    assert first["speculative"]["drafter"] == MTP and first["timings"]["draft_n"] > 0
    assert after["content"] == fresh["content"]


@pytest.mark.slow
def test_models_drafters_lists_the_heads_beside_the_drafters(qwen35_path: Path):
    from click.testing import CliRunner

    from localspec.cli import main

    r = CliRunner().invoke(main, ["models", "drafters", str(qwen35_path)])
    assert r.exit_code == 0, r.output
    assert "mtp (1 head in the file)" in r.output and "in the model" in r.output


def test_the_head_recovers_hidden_states_a_rebuilt_context_did_not_leave(qwen35_path: Path):
    """A flash attention switch (calibration tries one) rebuilds the target's context; a decode made on it before
    the head watched it left no hidden states, and a prompt that reuses that decode's prefix must still draft."""
    target = _load(qwen35_path, OPTIONS)
    d = MtpDrafter(MtpHead(target))
    try:
        prompt = target.tokenize(PROMPT, add_special=True)
        target.set_flash_attn(not target.options.flash_attn)
        target.decode(prompt[:3], 0)  # rows lost: the head sees the new context only after this decode
        _, steps = _run(target, prompt, d, k=3, n=8, fresh=False)
        assert steps[0].n_cached == 3 and sum(s.drafted for s in steps) > 0
    finally:
        d.close()
        target.close()
