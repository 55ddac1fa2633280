"""Adaptive speculation on the real SmolLM2-135M: the controller switches an
expensive drafter off on open prose and says why, and keeps long lookup drafts on a code rewrite.
Speed itself is measured by `localspec bench`, never asserted here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from localspec.bench.samples import PROSE as PROSE_PROMPTS
from localspec.bench.samples import REWRITE, REWRITE_START
from localspec.cli import main
from localspec.engine.engine import Engine
from localspec.speculative.drafters import HybridDrafter, ModelDrafter, PromptLookup
from localspec.speculative.types import LOOKUP_LONG
from localspec.tuning.calibration import measure_calibration
from localspec.tuning.controller import Adaptive

pytestmark = pytest.mark.slow

PROSE = PROSE_PROMPTS[0]
QUIET_CPU_V = (1.0, 1.5, 1.95, 2.4, 2.85, 3.3, 3.75)  # SmolLM2-135M Q4_1, 2 cores: v(3) ≈ 2.4 (docs/bench/report.md)


@pytest.fixture(scope="module")
def target(smollm2_target):
    return smollm2_target


@pytest.fixture(scope="module")
def self_draft(smollm2_twin):
    return smollm2_twin


@pytest.fixture(scope="module")
def calibrated(target, self_draft):
    """A whole calibration from empty caches, and the tokens it left in each: the module's models are shared,
    and in reverse order the other tests use them first. Its budget is one no load can use up: with 60 s, a
    suite run beside other work once spent it before the prompt and flash-attention stages, which were then
    dropped (`complete` False). These tests check what a whole calibration leaves; test_costs.py checks the
    budget."""
    target.rewind(0)
    self_draft.rewind(0)
    cal = measure_calibration(target, k_max=6, draft_model=self_draft, budget_s=3600.0)
    return cal, (list(target.tokens), list(self_draft.tokens))


@pytest.fixture(scope="module")
def cal(calibrated):
    return calibrated[0]


def chat(engine: Engine, text: str) -> list[int]:
    return engine.tokenize(engine.chat_prompt([{"role": "user", "content": text}]))


def test_calibration_leaves_caches_untouched(calibrated):
    cal, (target_tokens, draft_tokens) = calibrated
    assert target_tokens == [] and draft_tokens == []
    # v(γ) is not monotone by design (costs.at_least_one: a batch that fills the kernels' tiles may cost less
    # than one row fewer), so only its shape is asserted: v(0) = 1, one entry per γ, none cheaper than a row.
    assert cal.v[0] == 1.0 and len(cal.v) == 7 and min(cal.v) >= 1.0
    assert cal.costs.t1 > 0 and cal.costs.c["model"] > 0 and cal.complete
    assert set(cal.threads) == {"target", "draft", "prompt"} and cal.flash_attn in (True, False)


def test_self_drafting_on_prose_is_switched_off_with_a_reason(target, self_draft, cal):
    """The model as its own drafter costs c ≈ 1, so no γ beats plain decoding; lookup on open
    prose barely matches. The controller turns the model source off and says why."""
    ctl = Adaptive(sources=("lookup", "model"), k_max=6, v=cal.v, t1=cal.costs.t1,
                   c={"lookup": 0.0, "model": cal.costs.c["model"]})
    engine = Engine(target, HybridDrafter(PromptLookup(), ModelDrafter(self_draft)), controller=ctl)
    last = None
    for last in engine.generate(chat(engine, PROSE), max_tokens=96):
        pass
    st = ctl.state()
    print(f"\nself-draft prose: k_chosen {st.k_chosen}, c {st.c}, v {[round(x, 2) for x in st.v]}, off {st.off}, "
          f"by_source {last.stats.by_source}")
    assert st.k["model"] == 0
    # c > 1: not even full acceptance pays, so it never drafted, and the reason says so (no measured acceptance)
    assert st.off["model"].startswith("model: it would") and "even if every draft were accepted" in st.off["model"]


def test_lookup_on_code_rewrite_keeps_long_drafts(target):
    """Lookup matches a code rewrite, so the controller drafts γ > 1 and stays on. Costs are
    pinned to the curve measured on a quiet machine (docs/bench/report.md) so the test depends on the real model's
    acceptance, not on how busy the CI cores are; `localspec bench` measures the speed."""
    ctl = Adaptive(sources=PromptLookup.sources, k_max=6, v=QUIET_CPU_V, t1=0.005,
                   c=dict.fromkeys(PromptLookup.sources, 0.01), learn_costs=False)
    engine = Engine(target, PromptLookup(), controller=ctl)
    last = None
    prompt = engine.tokenize(engine.chat_prompt([{"role": "user", "content": REWRITE}]) + REWRITE_START)
    for last in engine.generate(prompt, max_tokens=96):
        pass
    st, s = ctl.state(), last.stats
    print(f"\nlookup rewrite: k_chosen {st.k_chosen}, alpha {[round(a, 2) for a in st.alpha[LOOKUP_LONG]]}, "
          f"accepted {s.draft_n_accepted}/{s.draft_n}, {s.mean_acceptance_length:.2f} tok/pass")
    drafting = {k: n for k, n in st.k_chosen.items() if k > 0}
    assert sum(n for k, n in drafting.items() if k > 1) > sum(drafting.values()) / 2
    assert st.k[LOOKUP_LONG] > 1 and st.spec_disabled_reason is None
    assert s.acceptance_rate > 0.5 and s.mean_acceptance_length > 1.5


def test_run_json_reports_adaptive_fields(smollm2_path):
    """`run --json` with the hybrid self-drafting pair: k_chosen, c, v, the reason, per-source acceptance."""
    r = CliRunner().invoke(main, ["run", PROSE, "--chat", "-n", "24", "--ctx", "512", "--json", "-m",
                                  str(smollm2_path), "--draft", str(smollm2_path), "--lookup", "--k-max", "4"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["adaptive"] is True and d["drafter"].startswith("lookup+")
    assert sum(d["k_chosen"].values()) == d["stats"]["rounds"]
    assert set(d["c"]) == {*PromptLookup.sources, "model"} and len(d["v"]) == 5 and d["v"][0] == 1.0
    assert "spec_disabled_reason" in d and isinstance(d["by_source"], dict)


def test_no_adaptive_fixes_k(smollm2_path):
    r = CliRunner().invoke(main, ["run", "def f(x):\n    return x\n\ndef g(x):\n", "-n", "16", "--ctx", "512",
                                  "--json", "-m", str(smollm2_path), "--lookup", "-k", "3", "--no-adaptive"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["adaptive"] is False and set(d["k_chosen"]) == {"3"} and d["spec_disabled_reason"] is None


def test_option_errors_are_one_line():
    r = CliRunner().invoke(main, ["run", "x", "--hybrid"])
    assert r.exit_code == 2 and "--hybrid needs a drafter model" in r.output
    r = CliRunner().invoke(main, ["run", "x", "--lookup", "--k-min", "5", "--k-max", "2"])
    assert r.exit_code == 2 and "--k-min 5 is above --k-max 2" in r.output
