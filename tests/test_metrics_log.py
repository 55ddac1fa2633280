"""The JSONL acceptance log: one valid line per request, written by the real CLI,
and no truncated line after a crash mid-request. Plus the Prometheus text helper over Stats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.engine.metrics import MetricsLog, add_stats, prometheus_text, read_log, repair_tail, request_record
from localspec.engine.stats import Stats
from localspec.speculative.types import ControllerState

STATS = Stats(n_prompt=10, n_generated=20, gen_ms=100.0, rounds=8, draft_n=12, draft_n_accepted=9,
              drafted_at=(6, 4, 2), accepted_at=(5, 3, 1), by_source={"lookup": (12, 9)})


@pytest.mark.slow
def test_run_writes_one_line_per_request(tmp_path, smollm2_path):
    log = tmp_path / "logs" / "acceptance.jsonl"
    for task in ("code", None):
        args = ["run", "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "-n", "12", "--ctx", "512",
                "-m", str(smollm2_path), "--lookup", "--metrics-log", str(log)] + (["--task", task] if task else [])
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    recs = [json.loads(x) for x in lines]
    for rec in recs:
        for key in ("model", "drafter", "mode", "k_chosen", "draft_n", "draft_n_accepted",
                    "acceptance_per_position", "tokens_per_second", "task", "c", "v", "spec_disabled_reason"):
            assert key in rec
        assert rec["drafter"] == "lookup" and rec["n_generated"] > 0
        assert sum(rec["k_chosen"].values()) == rec["rounds"]
    assert recs[0]["task"] == "code" and recs[1]["task"] is None
    assert list(read_log(log)) == recs


CRASHER = r"""
import sys, time
from localspec.backend import LoadOptions
from localspec.engine.loader import EngineConfig, load_engine
from localspec.engine.metrics import MetricsLog, request_record
log = MetricsLog(sys.argv[2])
engine = load_engine(EngineConfig(model=sys.argv[1], draft="lookup", n_ctx=512), log=lambda *a: None)
last = None
for last in engine.generate("One, two, three,", max_tokens=4):
    pass
log.write(request_record(model=engine.name, drafter=engine.drafter_name, mode="spec", stats=last.stats))
print("first done", flush=True)
while True:  # the second request never ends: killed mid-request
    for chunk in engine.generate("Count to a thousand:", max_tokens=400):
        print("tick", flush=True)
"""


@pytest.mark.slow
def test_log_survives_a_crash_mid_request(tmp_path, smollm2_path):
    log = tmp_path / "a.jsonl"
    p = subprocess.Popen([sys.executable, "-c", CRASHER, str(smollm2_path), str(log)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "first done"
        assert p.stdout.readline().strip() == "tick"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait(30)
    data = log.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data)["n_generated"] > 0


def test_partial_tail_is_repaired_and_unreadable_lines_skipped(tmp_path):
    log = tmp_path / "b.jsonl"
    log.write_bytes(b'{"a": 1}\nnot json\n{"b": 2}\n{"trunc')
    assert repair_tail(log) == len(b'{"trunc')
    m = MetricsLog(log)  # opening repairs too (already clean now)
    m.write({"c": 3})
    assert log.read_bytes().endswith(b'{"b": 2}\n{"c":3}\n')
    assert list(read_log(log)) == [{"a": 1}, {"b": 2}, {"c": 3}]
    only = tmp_path / "c.jsonl"
    only.write_bytes(b'{"no newline at all"')
    MetricsLog(only)
    assert only.read_bytes() == b""


def test_request_record_counts_this_requests_k_only():
    before = ControllerState(True, {0: 5, 3: 2}, {}, (), {}, {}, {}, None)
    after = ControllerState(True, {0: 6, 3: 9, 4: 1}, {"lookup": 0.01}, (1.0, 1.5), {}, {}, {}, None)
    rec = request_record(model="m", drafter="lookup", mode="spec", stats=STATS, controller=after, before=before,
                         task="t")
    assert rec["k_chosen"] == {"0": 1, "3": 7, "4": 1}
    assert rec["acceptance_per_position"] == [5 / 6, 3 / 4, 1 / 2]
    assert rec["by_source"]["lookup"]["acceptance_rate"] == 0.75 and rec["task"] == "t"
    json.dumps(rec)


def test_prometheus_text_is_a_pure_function_of_stats():
    total = add_stats(STATS, STATS)
    assert total.draft_n == 24 and total.drafted_at == (12, 8, 4) and total.by_source == {"lookup": (24, 18)}
    txt = prometheus_text(total, labels={"model": 'a"b'}, gauges={"spec_enabled": 1})
    assert 'localspec_draft_tokens_total{model="a\\"b"} 24' in txt
    assert 'localspec_draft_position_accepted_total{model="a\\"b",position="1"} 10' in txt
    assert 'localspec_draft_source_proposed_total{model="a\\"b",source="lookup"} 24' in txt
    assert "# TYPE localspec_generation_seconds_total counter" in txt and txt.endswith("\n")
    assert 'localspec_spec_enabled{model="a\\"b"} 1' in txt
