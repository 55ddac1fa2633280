"""Lossless on recurrent and hybrid models (tiny random-weight Mamba, LFM2 and Granite-hybrid files, tiny_gguf.py):
a rewind restores the exact state or decodes it again, never a silently emptied one; greedy speculation gives plain
decoding's text with every drafter; a seed gives one text; a request after another gives a fresh server's answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import httpx
import numpy as np
import pytest
from drafting import run_fixed as _run
from servers import ServerProcess
from tiny_gguf import ARCHS

from localspec.backend import LoadOptions, Model
from localspec.backend.quantize import quantize
from localspec.backend.rollback import METHODS
from localspec.sampling.constrain import build_constraint
from localspec.sampling.params import SamplingParams
from localspec.server.request.structured import json_schema_grammar
from localspec.speculative.drafters import ModelDrafter, PromptLookup
from localspec.speculative.loop import generate
from localspec.speculative.structure import StructureDrafter
from localspec.tuning.fixed import FixedK

KIND = {"mamba": "recurrent", "lfm2": "hybrid", "granitehybrid": "hybrid"}
NEAR_TIE = 1e-3  # batched and one-row decodes differ by ~1e-4 in these models' logits; a wrong state by ~0.1
REPEATED = "The quick brown fox jumps over the lazy dog. " * 3 + "The quick brown fox"
OPTIONS = LoadOptions(n_ctx=512)


def _arch(path: Path) -> str:
    return path.name.split("-")[1]


@pytest.fixture(scope="module")
def target(tiny_recurrent: Path):
    m = Model.load(tiny_recurrent, OPTIONS)
    yield m
    m.close()


@pytest.fixture(scope="module")
def reference(tiny_recurrent: Path):
    """A second copy of the model, for logits computed from an empty state."""
    m = Model.load(tiny_recurrent, OPTIONS)
    yield m
    m.close()


def _fresh_logits(reference: Model, tokens: list[int]) -> np.ndarray:
    reference.rewind(0)
    return reference.decode(tokens, 1)[0].astype(np.float64)


def _same_or_near_tie(reference: Model, prompt: list[int], plain: list[int], spec: list[int]) -> None:
    """The texts agree, or part where the target's own logits hold a near tie (docs/design.md, Numerics)."""
    if plain == spec:
        return
    i = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    assert i < min(len(plain), len(spec)), f"one text stopped early at {i}"
    row = _fresh_logits(reference, prompt + plain[:i])
    assert abs(row[plain[i]] - row[spec[i]]) < NEAR_TIE, f"parted at token {i} without a near tie"


def test_memory_kind_and_rollback_method(target: Model, tiny_recurrent: Path):
    arch = _arch(tiny_recurrent)
    info = target.rollback_info
    assert info.kind == KIND[arch] and target.memory_kind == KIND[arch]
    assert (info.rs_depth > 0) == (arch == "lfm2")  # llama.cpp's snapshots: LFM2 yes, Mamba and Granite no
    # with snapshots only host copies (a spare sequence would share a rolled-back state's stale plane)
    assert set(info.timings_ms) == ({"host"} if info.rs_depth else set(METHODS)) and info.method in info.timings_ms
    assert arch in info.describe() or info.kind in info.describe()


@pytest.mark.parametrize("back", [1, 3, 6, 8])
def test_rewind_gives_the_state_of_the_tokens_kept(target: Model, reference: Model, back: int):
    prompt = target.tokenize("Once upon a time in a small village", add_special=True)
    more = target.tokenize(" there lived an old man who kept bees", add_special=False)[:8]
    target.rewind(0)
    target.decode(prompt, 0)
    target.checkpoint("round", ahead=back)
    target.decode(more, 1)
    kept = len(prompt) + len(more) - back
    target.rewind(kept)
    assert target.tokens == (prompt + more)[:kept]
    got = target.decode([more[-back]], 1)[0].astype(np.float64)
    want = _fresh_logits(reference, (prompt + more)[:kept + 1])
    assert np.abs(got - want).max() < NEAR_TIE


@pytest.mark.parametrize("method", METHODS)
def test_each_rollback_method_is_exact(tiny_recurrent: Path, reference: Model, method: str):
    """Whichever method the load's timing picks, both give exact states: rewinds within and past a verify-sized
    decode, prompt reuse across requests, and greedy lookup against plain decoding."""
    from dataclasses import replace

    from localspec.backend.rollback import Rollback

    m = Model.load(tiny_recurrent, OPTIONS)
    try:
        if method == "seq" and m.rollback_info.rs_depth:
            pytest.skip("no spare sequences beside llama.cpp's snapshots (rollback.py)")
        m.rollback_info = replace(m.rollback_info, method=method)
        m._rollback = Rollback(m.ctx_pointer, m.rollback_info)
        toks = m.tokenize(REPEATED, add_special=True)
        for back in (1, 4, 9):
            m.rewind(0)
            m.decode(toks[:10], 0)
            m.checkpoint("round")
            m.decode(toks[10:20], 1)
            m.rewind(20 - back)
            got = m.decode(toks[20 - back:21 - back], 1)[0].astype(np.float64)
            assert np.abs(got - _fresh_logits(reference, toks[:21 - back])).max() < NEAR_TIE, back
        a = m.tokenize("Once upon a time there was a bee", add_special=True)
        _run(m, a, n=8)
        again = list(generate(m, a + [42], controller=FixedK(0), max_tokens=8))  # from A's prompt checkpoint
        assert again[0].n_cached == len(a) - 1
        assert [t for s in again for t in s.tokens] == _run(reference, a + [42], n=8)[0]
        prompt = m.tokenize(REPEATED, add_special=True)
        _same_or_near_tie(reference, prompt, _run(m, prompt)[0], _run(m, prompt, PromptLookup(), k=4)[0])
        assert m.rollback_counts["restores"] > 0
    finally:
        m.close()


def test_a_checkpoint_taken_right_after_a_rollback_holds_the_rolled_back_state(target: Model, reference: Model):
    """On LFM2 a rewind into the last decode uses llama.cpp's snapshot, which stays pending until the next decode;
    a checkpoint taken in between (a prompt's end after a finished answer) must hold the rolled-back state."""
    toks = target.tokenize(REPEATED, add_special=True)
    target.rewind(0)
    target.decode(toks[:10], 0)
    target.decode(toks[10:16], 1)
    target.rewind(13)  # 3 back: within the last decode (a snapshot on LFM2, a replay elsewhere)
    target.checkpoint("prompt")
    target.decode(toks[13:20], 1)
    target.rewind(13)  # 7 back past... a new decode: from the checkpoint
    got = target.decode(toks[13:14], 1)[0].astype(np.float64)
    assert np.abs(got - _fresh_logits(reference, toks[:14])).max() < NEAR_TIE


def test_a_rewind_with_no_checkpoint_decodes_the_prefix_again(target: Model, reference: Model):
    """Never a silent clear: with nothing to restore, the state is rebuilt from the tokens the model holds."""
    toks = target.tokenize(REPEATED, add_special=True)
    target.rewind(0)
    target.decode(toks[:1], 0)
    target.decode(toks[1:], 1)  # one decode of many tokens: no checkpoint, llama.cpp's snapshots reach 8 back
    before = target.rollback_counts["replayed"]
    target.rewind(5)
    assert target.rollback_counts["replayed"] - before == 5  # tokens 0..4 again, from the empty state
    got = target.decode(toks[5:6], 1)[0].astype(np.float64)
    assert np.abs(got - _fresh_logits(reference, toks[:6])).max() < NEAR_TIE


def test_greedy_lookup_is_plain_decoding(target: Model, reference: Model):
    prompt = target.tokenize(REPEATED, add_special=True)
    plain, _ = _run(target, prompt)
    spec, steps = _run(target, prompt, PromptLookup(), k=4)
    assert sum(s.drafted for s in steps) > 0 and any(s.accepted < s.drafted for s in steps)  # rejections ran
    _same_or_near_tie(reference, prompt, plain, spec)


@pytest.fixture(scope="module")
def self_copy(tiny_recurrent: Path, tmp_path_factory) -> Path:
    """The target quantized to Q8_0 (`models make-drafter`'s kind of drafter): same tokens, nearly same text."""
    return quantize(tiny_recurrent, tmp_path_factory.mktemp("copy") / "self.Q8_0.gguf", "Q8_0")


@pytest.mark.parametrize("which", ["itself", "self-copy", "another-arch"])
def test_greedy_model_drafter_is_plain_decoding(target: Model, reference: Model, tiny_recurrent: Path,
                                                self_copy: Path, tiny_model: Callable[[str], Path], which: str):
    """A recurrent drafter too: the model itself (everything accepted), its Q8_0 copy, and another architecture
    with the same tokenizer (mostly rejected). The other architecture's file is written here if this run has not
    written it yet: on a fresh machine the cache holds only what earlier tests asked for."""
    if which == "itself":
        path = tiny_recurrent
    elif which == "self-copy":
        path = self_copy
    else:
        path = tiny_model(min(a for a in ARCHS if a != _arch(tiny_recurrent)))
    drafter = ModelDrafter(Model.load(path, OPTIONS))
    try:
        prompt = target.tokenize("Write a short story about a robot.", add_special=True)
        plain, _ = _run(target, prompt)
        spec, steps = _run(target, prompt, drafter, k=4)
        _same_or_near_tie(reference, prompt, plain, spec)
        drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
        if which == "itself":
            assert accepted == drafted > 0
        if which == "another-arch":
            assert accepted < drafted
    finally:
        drafter.close()


def test_greedy_structure_drafter_is_plain_decoding(target: Model, reference: Model):
    grammar = json_schema_grammar({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                                    "count": {"type": "integer"}},
                                   "required": ["name", "count"]})
    prompt = target.tokenize("Give a JSON object:", add_special=True)
    texts = []
    for structure in (False, True):
        params = SamplingParams(constraint=build_constraint(target, grammar=grammar))
        drafter = StructureDrafter(target.piece, is_eog=target.is_eog) if structure else None
        out, steps = _run(target, prompt, drafter, k=8 if structure else 0, params=params, n=30)
        texts.append(out)
    assert texts[0] == texts[1]  # the grammar decides most tokens; where it does not, the target's argmax


@pytest.mark.parametrize("drafter_kind", ["lookup", "model"])
def test_sampled_same_seed_same_text(target: Model, tiny_recurrent: Path, drafter_kind: str):
    params = SamplingParams(temperature=0.9, seed=7)
    prompt = target.tokenize(REPEATED, add_special=True)
    plain, _ = _run(target, prompt, params=params)
    drafter = PromptLookup() if drafter_kind == "lookup" else ModelDrafter(Model.load(tiny_recurrent, OPTIONS))
    try:
        spec, steps = _run(target, prompt, drafter, k=4, params=params)
    finally:
        drafter.close()
    assert sum(s.drafted for s in steps) > 0
    assert spec == plain


def test_prompt_reuse_says_what_it_reused(target: Model, reference: Model):
    """Requests after another: each text is a fresh model's, and `n_cached` counts only what was really kept
    (the live state, the checkpoint at the last prompt's end, or nothing)."""
    a = target.tokenize(REPEATED + " and the cat sat on the mat", add_special=True)
    answer, _ = _run(target, a, n=10)

    def then(prompt: list[int]) -> tuple[list[int], int]:
        steps = list(generate(target, prompt, controller=FixedK(0), max_tokens=10))  # the cache as left
        assert [t for s in steps for t in s.tokens] == _run(reference, prompt, n=10)[0]
        return [t for s in steps for t in s.tokens], steps[0].n_cached

    follow_up = a + answer + target.tokenize(" Then what?", add_special=False)
    assert then(follow_up)[1] == len(a) + len(answer) - 1  # the state the answer left, as it was
    assert then(a + answer[:3])[1] == len(a) - 1  # past the prompt's end: from its checkpoint
    assert then(a[:12] + target.tokenize(" a different ending", add_special=False))[1] == 0  # before it: empty


@pytest.mark.slow
def test_server_request_after_another_is_a_fresh_servers_answer(tiny_recurrent: Path):
    """B after A on one server, against B on a fresh server: same text; `cache_n` no more than a checkpoint."""
    a = {"prompt": REPEATED + " and then the dog woke up", "n_predict": 16, "temperature": 0}
    b = {"prompt": REPEATED + " but the cat was asleep", "n_predict": 16, "temperature": 0}
    args = ["--model", str(tiny_recurrent), "--ctx", "512", "--lookup", "-k", "4", "--no-adaptive"]
    with ServerProcess(args) as srv:
        httpx.post(srv.url + "/completion", json=a, timeout=60).raise_for_status()
        after = httpx.post(srv.url + "/completion", json=b, timeout=60).json()
    with ServerProcess(args) as srv:
        fresh = httpx.post(srv.url + "/completion", json=b, timeout=60).json()
    assert after["content"] == fresh["content"]
    assert after["timings"]["cache_n"] < fresh["tokens_evaluated"]


def test_models_show_states_the_memory_kind_and_rollback(tiny_recurrent: Path):
    from click.testing import CliRunner

    from localspec.cli import main

    r = CliRunner().invoke(main, ["models", "show", str(tiny_recurrent), "--json"])
    assert r.exit_code == 0, r.output
    memory = json.loads(r.output)["memory"]
    assert memory["kind"] == KIND[_arch(tiny_recurrent)] and memory["rollback"] in METHODS
    text = CliRunner().invoke(main, ["models", "show", str(tiny_recurrent)]).output
    assert f"memory: {memory['kind']} (checkpoints in " in text  # the method is timed again: either may win


def test_run_reports_what_rewinding_cost(tiny_recurrent: Path):
    """`run --json` names each model's memory and counts this request's checkpoints, restores and replays."""
    from click.testing import CliRunner

    from localspec.cli import main

    r = CliRunner().invoke(main, ["run", "--model", str(tiny_recurrent), "--lookup", "-k", "4", "--no-adaptive",
                                  "-n", "24", "--temp", "0", "--ctx", "512", "--json", REPEATED])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    target = out["memory"]["target"]
    assert target["kind"] == KIND[_arch(tiny_recurrent)]
    rejected = out["draft_n"] - out["draft_n_accepted"]
    assert rejected > 0
    if not target["rs_depth"]:  # without llama.cpp's snapshots each rejection restores a checkpoint and replays
        assert target["saves"] > 0 and target["restores"] > 0 and target["replayed"] > 0
    assert "drafter" not in out["memory"]  # prompt lookup has no model
