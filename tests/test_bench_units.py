"""`localspec bench` without a model: the prediction formula, the task set, summaries, the log reader."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from localspec.bench.fromlog import read_log
from localspec.bench.report import Report, text_table
from localspec.bench.runner import PLAIN, Plan, Run, TargetResult
from localspec.bench.summary import ALL, rows_for, verdict, winners
from localspec.bench.tasks import TASKS, BenchInputError, builtin_prompts, parse_jsonl, select
from localspec.bench.theory import best_gamma, conditional_alpha, expected_tokens, predicted_speedup
from localspec.bench.versus import auto_vs_fixed
from localspec.tuning.costs import Costs

# -- theory ----------------------------------------------------------------------------------------------------

def test_expected_tokens_known_values():
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)  # 3.3616
    assert expected_tokens(0.0, 5) == 1.0  # nothing accepted: the target's own token only
    assert expected_tokens(1.0, 5) == 6.0  # everything accepted + the bonus token
    assert expected_tokens(0.5, 0) == 1.0  # γ = 0 is plain decoding


def test_conditional_alpha_gives_back_the_measured_length():
    for alpha, gamma in ((0.5, 2), (0.93, 4), (0.99, 8)):
        assert conditional_alpha(expected_tokens(alpha, gamma), gamma) == pytest.approx(alpha, abs=1e-6)
    assert conditional_alpha(1.0, 4) == 0.0


def test_predicted_speedup_known_values():
    # α=0.8, γ=4, c=0.1, v=1.5: E=3.3616, cost = 0.4 + 1.5 = 1.9
    assert predicted_speedup(0.8, 4, 0.1, 1.5) == pytest.approx(3.3616 / 1.9)
    # a free drafter and a free verify: the speedup is E itself
    assert predicted_speedup(0.6, 3, 0.0, 1.0) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    # α = 0: pure loss, 1 / (γc + v)
    assert predicted_speedup(0.0, 2, 0.25, 1.5) == pytest.approx(0.5)


def test_best_gamma_moves_with_alpha_and_cost():
    v = {1: 1.1, 2: 1.2, 4: 1.4, 8: 2.0}
    assert best_gamma(0.95, 0.0, v)[0] == 8  # near-perfect drafts, cheap verify: draft long
    assert best_gamma(0.5, 0.0, v)[0] in (1, 2)  # poor drafts: short
    assert best_gamma(0.1, 0.5, v) == (0, 1.0)  # nothing beats plain decoding
    g, s = best_gamma(0.8, 0.05, v)
    assert s == pytest.approx(max(predicted_speedup(0.8, k, 0.05, x) for k, x in v.items()))


def test_theory_rejects_nonsense():
    with pytest.raises(ValueError):
        expected_tokens(1.2, 2)
    with pytest.raises(ValueError):
        expected_tokens(0.5, -1)


# -- tasks -----------------------------------------------------------------------------------------------------

def test_builtin_tasks_cover_every_kind_with_several_prompts():
    prompts = builtin_prompts()
    for task in TASKS:
        assert sum(p.task == task for p in prompts) >= 3, task
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(not p.chat for p in prompts if p.task == "code")  # completion prompts are raw code


def test_select_filters_and_limits():
    prompts = builtin_prompts()
    sel = select(prompts, ["edit", "rag"], 2)
    assert [p.task for p in sel] == ["edit", "edit", "rag", "rag"]
    with pytest.raises(BenchInputError, match="unknown task"):
        select(prompts, ["poetry"])


def test_parse_jsonl_user_prompts_and_errors():
    got = parse_jsonl(['{"task": "mine", "prompt": "hi"}', "", '{"prompt": "raw", "chat": false}'], "f")
    assert [(p.task, p.chat) for p in got] == [("mine", True), ("custom", False)]
    with pytest.raises(BenchInputError, match="f:1: not valid JSON"):
        parse_jsonl(["{oops"], "f")
    with pytest.raises(BenchInputError, match="prompt"):
        parse_jsonl(['{"task": "x"}'], "f")


# -- summary (synthetic runs) ----------------------------------------------------------------------------------

def _run(drafter, k, task, n, ms, draft_n=0, acc=0, rounds=None):
    # first round: 10 ms, 1 token (excluded from the decode rate, included in end-to-end time via TTFT)
    return Run("t", drafter, k, task, f"{task}-1", 0.0, 0, 10, n + 1, ms + 10.0, 50.0, rounds or n, draft_n, acc,
               1.0, (draft_n,), (acc,), (0,), "length", 10.0, 1)


def _result(runs) -> TargetResult:
    costs = Costs(t1=0.010, v=(1.0, 1.2, 1.4), c={"lookup": 0.01}, position=100)
    return TargetResult("t", "t.gguf", "desc", costs, tuple(runs), (), True)


def test_rows_measured_and_predicted_speedup():
    runs = [_run(PLAIN, 0, "edit", 100, 1000.0), _run("lookup", 2, "edit", 100, 500.0, 80, 60, 40),
            _run(PLAIN, 0, "prose", 100, 1000.0), _run("lookup", 2, "prose", 100, 1250.0, 20, 2, 90)]
    rows = {(r.config, r.task): r for r in rows_for(_result(runs))}
    assert rows[("lookup k=2", "edit")].speedup == pytest.approx(2.0)
    assert rows[("lookup k=2", "prose")].speedup == pytest.approx(0.8)
    assert rows[("lookup k=2", ALL)].speedup == pytest.approx(200 / 1.75 / 100)
    assert rows[("lookup k=2", "edit")].e2e_speedup == pytest.approx((101 / 0.55) / (101 / 1.05))
    edit = rows[("lookup k=2", "edit")]
    assert edit.acceptance_rate == pytest.approx(0.75)
    assert edit.mean_acceptance_length == pytest.approx(1 + 60 / 40)
    # the rounds' own 2.5 tokens a round, not E(0.75, 2) = 2.31: acceptance may come in runs
    assert edit.predicted_speedup == pytest.approx(2.5 / (2 * 0.01 + 1.4))
    assert edit.predicted_best_k == best_gamma(conditional_alpha(2.5, 2), 0.01, {1: 1.2, 2: 1.4})[0]
    best = {b.task: b for b in winners(list(rows.values()))}
    assert best["edit"].config == "lookup k=2"
    text = verdict(list(rows.values()))
    assert "on edit lookup k=2 gives 2.00×" in text and "prose" in text and "loses 20 %" in text
    assert "adaptive" in text


def test_text_table_says_when_the_weights_verify_row_by_row(smollm2_path, gemma_path):
    # SmolLM2-135M's shipped file is Q4_1 (no batched CPU kernel); Gemma-3-270M's Q4_K_M is batched; a file the
    # report cannot read (a run log's path on another machine) adds nothing rather than failing the report
    runs = [_run(PLAIN, 0, "edit", 100, 1000.0), _run("lookup", 2, "edit", 100, 500.0, 80, 60, 40)]
    for path, hinted in ((smollm2_path, True), (gemma_path, False), ("t.gguf", False)):
        text = text_table(Report.build(Plan((), ()), [replace(_result(runs), path=str(path))], "cmd"))
        assert ("are Q4_1, which llama.cpp multiplies a row at a time on most CPUs" in text) is hinted, path


# -- --from-log ------------------------------------------------------------------------------------------------

def test_read_log_is_defensive(tmp_path):
    log = tmp_path / "m.jsonl"
    good = {"model": "m", "drafter": "lookup", "mode": "spec", "k": 4, "task": "edit", "draft_n": 40,
            "draft_n_accepted": 30, "acceptance_per_position": [0.9, 0.8, 0.7, 0.6], "tokens_per_second": 200}
    adaptive = {"model": "m", "drafter": "lookup", "mode": "spec", "adaptive": True, "draft_n": 10,
                "draft_n_accepted": "junk"}
    log.write_text("\n".join([json.dumps(good), "not json", "[1, 2]", json.dumps(good), json.dumps(adaptive),
                              '{"model": "m", "draft_n": 3'  # a cut last line
                              ]))
    rows, skipped = read_log(log)
    assert skipped == 3
    r = next(r for r in rows if r.k == 4)
    assert (r.requests, r.draft_n, r.draft_n_accepted) == (2, 80, 60)
    assert r.expected_tokens_per_round == pytest.approx(expected_tokens(0.75, 4))
    assert r.acceptance_per_position == pytest.approx((0.9, 0.8, 0.7, 0.6))
    auto = next(r for r in rows if r.k == "auto")
    assert auto.draft_n_accepted == 0 and not math.isnan(auto.acceptance_rate)


def test_read_log_missing_file(tmp_path):
    with pytest.raises(BenchInputError, match="not found"):
        read_log(tmp_path / "nope.jsonl")


# -- auto against its fixed neighbours (versus.py) ---------------------------------------------------------------

def _rep(drafter, k, task, ms, repeat):
    return replace(_run(drafter, k, task, 100, ms), repeat=repeat, prompt_id=f"{task}-{repeat}")


def test_auto_against_the_best_fixed_choice_with_its_spread_over_repeats():
    # plain 100 tok/s; k=2 200 and 250 (best); k=8 150; auto 250 then 200: 1.00 in repeat 0, 0.80 in repeat 1
    runs = [_rep(PLAIN, 0, "edit", 1000.0, 0), _rep(PLAIN, 0, "edit", 1000.0, 1),
            _rep("lookup", 2, "edit", 500.0, 0), _rep("lookup", 2, "edit", 400.0, 1),
            _rep("lookup", 8, "edit", 666.7, 0), _rep("lookup", 8, "edit", 666.7, 1),
            _rep("lookup", "auto", "edit", 400.0, 0), _rep("lookup", "auto", "edit", 500.0, 1)]
    res = _result(runs)
    (edit, overall) = auto_vs_fixed(res)
    assert (edit.task, overall.task) == ("edit", ALL)
    assert edit.best == "k=2" and edit.ratio == pytest.approx(1.0)
    assert edit.per_repeat == pytest.approx((1.25, 0.8))
    text = text_table(Report.build(Plan((), ()), [res], "cmd"))
    assert "auto against its fixed neighbours" in text
    assert "lookup T=0 edit: auto 222.2 tok/s, best fixed k=2 222.2: 1.00× (per repeat 0.80-1.25)  <- below" in text


def test_plain_is_a_fixed_choice_and_no_auto_row_means_no_comparison():
    runs = [_run(PLAIN, 0, "prose", 100, 500.0), _run("lookup", 4, "prose", 100, 1000.0),
            _run("lookup", "auto", "prose", 100, 550.0)]
    (prose, _) = auto_vs_fixed(_result(runs))
    assert prose.best == "plain" and prose.ratio == pytest.approx(500 / 550)
    assert auto_vs_fixed(_result(runs[:2])) == []
