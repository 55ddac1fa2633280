"""`localspec bench` for real: the embedded model on a tiny budget, driven through the CLI.

Checks the JSON schema, that the plot is a valid PNG, the Markdown report, greedy agreement records,
measured costs, and that user errors are one line with an exit code.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from localspec.cli import main

pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_run(smollm2_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--quick", "--model", str(smollm2_path), "--tasks", "edit,prose", "--max-tokens", "12",
            "--k", "2,auto", "--ctx", "1024", "--json", str(out / "b.json"), "--plot", str(out / "b.png"),
            "--markdown", str(out / "b.md"), "--busy", "1"]
    res = CliRunner().invoke(main, args)
    return res, out


def test_quick_prints_table_and_verdict(quick_run):
    res, _ = quick_run
    assert res.exit_code == 0, res.output
    assert "plain" in res.output and "lookup k=2" in res.output
    assert "verdict: On " in res.output
    assert "greedy agreement:" in res.output
    assert "Machine made busy: 1 CPU-bound background process" in res.output  # --busy 1 is noted
    assert "threads at the end of runs:" in res.output


def test_json_schema(quick_run):
    _, out = quick_run
    d = json.loads((out / "b.json").read_text())
    assert d["schema"] == "localspec.bench/1" and d["settings"]["busy"] == 1
    assert {"command", "machine", "settings", "targets", "results", "best", "agreement", "runs", "verdict"} <= set(d)
    assert d["settings"]["ks"] == [2] and d["settings"]["max_tokens"] == 12
    (t,) = d["targets"]
    costs = t["costs"]
    assert costs["t_target_ms"] > 0 and costs["c"]["lookup"] >= 0
    assert all(float(v) > 0 for v in costs["v"].values()) and "2" in costs["v"]
    configs = {r["config"] for r in d["results"]}
    assert {"plain", "lookup k=2"} <= configs
    assert {r["task"] for r in d["results"]} == {"edit", "prose", "all"}
    for r in d["results"]:
        for key in ("tokens_per_second", "ttft_ms", "per_token_ms", "acceptance_rate", "mean_acceptance_length",
                    "acceptance_per_position", "accept_hist", "speedup", "e2e_speedup", "predicted_speedup", "c", "v"):
            assert key in r, key
        if r["config"] == "plain":
            assert r["speedup"] == pytest.approx(1.0)
        if r["config"] == "lookup k=2":
            assert r["predicted_speedup"] > 0 and r["v"] == pytest.approx(costs["v"]["2"])
            assert len(r["accept_hist"]) == 3 and sum(r["accept_hist"]) >= 1
    # 2 prompts x (plain, lookup k=2, maybe auto): every run generated tokens from an empty cache
    assert all(run["n_generated"] > 0 and run["n_prompt"] > 1 for run in d["runs"])
    assert "tokens" not in d["runs"][0] and all(run["threads"] >= 1 for run in d["runs"])
    # greedy agreement: one record per spec run, divergences explained by the target's top-2
    assert len(d["agreement"]) == sum(run["drafter"] != "none" for run in d["runs"])
    for a in d["agreement"]:
        assert a["agree"] or (a["position"] is not None and a["gap"] is not None)
    assert d["verdict"]


def test_quick_runs_the_adaptive_controller(quick_run):
    _, out = quick_run
    d = json.loads((out / "b.json").read_text())
    assert any(r["k"] == "auto" for r in d["results"]) and d["settings"]["auto"]


def test_plot_is_png_and_markdown_links_it(quick_run):
    _, out = quick_run
    assert (out / "b.png").read_bytes()[:8] == PNG_MAGIC
    md = (out / "b.md").read_text()
    assert md.startswith("# localspec bench report") and "](b.png)" in md and "| plain |" in md


def test_from_log_reads_a_metrics_log(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text(json.dumps({"model": "m", "drafter": "lookup", "mode": "spec", "k": 4, "draft_n": 8,
                               "draft_n_accepted": 6}) + "\n")
    res = CliRunner().invoke(main, ["bench", "--from-log", str(log), "--json", str(tmp_path / "o.json")])
    assert res.exit_code == 0, res.output
    assert "lookup" in res.output and "0.75" in res.output
    assert json.loads((tmp_path / "o.json").read_text())["rows"][0]["draft_n"] == 8


@pytest.mark.parametrize("args, code, needle", [
    (["--prompts", "/nonexistent/p.jsonl"], 2, "prompts file not found"),
    (["--tasks", "poetry"], 2, "unknown task"),
    (["--k", "two"], 2, "not a draft length"),
    (["--from-log", "/nonexistent/m.jsonl"], 2, "log file not found"),
])
def test_user_errors_are_one_line(args, code, needle, smollm2_path):
    res = CliRunner().invoke(main, ["bench", "--model", str(smollm2_path), *args])
    assert res.exit_code == code, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_ctrl_c_writes_a_partial_report_of_the_finished_runs(smollm2_path, tmp_path):
    """A real SIGINT to the console script once two runs are done: exit 130, both runs kept, marked partial."""
    import shutil
    import signal
    import subprocess
    import sys

    exe = shutil.which("localspec")
    cmd = [exe] if exe else [sys.executable, "-m", "localspec"]
    p = subprocess.Popen(cmd + ["bench", "--quick", "--model", str(smollm2_path), "--tasks", "edit,prose", "-k", "2",
                                "--max-tokens", "8", "--ctx", "1024", "--json", str(tmp_path / "p.json"),
                                "--markdown", str(tmp_path / "p.md")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # a suite started in the background (`.ci/run &`) ignores SIGINT, and so would the child
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in p.stderr:  # stderr is not a terminal: one line as each run starts
        if line.startswith("bench: run 3/"):
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "partial report of the 2 finished runs of 4" in err
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["partial"] is True and len(d["runs"]) == 2 and d["agreement"] == []
    assert "**Partial report**" in (tmp_path / "p.md").read_text()
    assert "verdict (partial): " in out
