"""The file's own MTP heads beside the other drafters: `bench --draft mtp` gives them rows of their own, the
controller starts them from the prior they declare, and `--hybrid --draft mtp` puts prompt lookup first and the
head after it, on the hybrid (recurrent) qwen35 fixture, with plain decoding's text (the exact rollback holds).

The fixtures are tests/tiny_gguf.py's random qwen35 with one MTP head, and its echo (a head that agrees with the
trunk at noise 0), as tests/test_mtp.py writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CACHE
from tiny_gguf import VERSION, file_name, write_qwen35_echo, write_tiny

from localspec.cli import main
from localspec.speculative.drafters import HybridDrafter, PromptLookup
from localspec.speculative.mtp import MTP, MtpDrafter
from localspec.tuning.controller import Adaptive

PROMPT = "Write a short story about a robot who learns to paint. The robot paints. The robot paints."


@pytest.fixture(scope="module")
def qwen35_path(smollm2_path: Path) -> Path:
    out = CACHE / "fixtures" / file_name("qwen35")
    if not out.exists():
        write_tiny("qwen35", smollm2_path, out)
    return out


@pytest.fixture(scope="module")
def echo_path(smollm2_path: Path) -> Path:
    """The echo fixture at noise 0: the head drafts what the trunk will say, so drafts are accepted."""
    out = CACHE / "fixtures" / f"tiny-qwen35-echo-v{VERSION}-0.0.gguf"
    if not out.exists():
        write_qwen35_echo(smollm2_path, out, noise=0.0)
    return out


class _NoHead:
    """A head that is never asked to draft (the prior is read before any round)."""

    def start(self, context):  # pragma: no cover - not called
        return None

    def step(self, token):  # pragma: no cover - not called
        raise AssertionError

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_head_declares_a_prior_the_controller_starts_from():
    """Published single heads accept ~0.6-0.8 of first positions; the controller's estimate before any round is
    the declared prior, at the first position and the later ones."""
    d = MtpDrafter(_NoHead())
    first, later = d.prior[MTP]
    assert 0.6 <= first <= 0.8 and 0.6 <= later <= 0.9
    ctl = Adaptive(sources=d.sources, k_min=1, k_max=4, c={MTP: 0.1}, prior=d.prior)
    ctl.k_for(MTP)  # the estimate is made on first sight
    alpha = ctl.state().alpha[MTP]
    assert alpha[0] == pytest.approx(first) and alpha[1] == pytest.approx(later)


def test_a_hybrid_drafter_takes_the_head_after_lookup():
    d = HybridDrafter(PromptLookup(), MtpDrafter(_NoHead()))
    assert d.sources[-1] == MTP and d.cost[MTP] is None and d.prior[MTP] == MtpDrafter.prior[MTP]


def _run(path: Path, *flags: str, n: int = 24) -> dict:
    r = CliRunner().invoke(main, ["run", "--model", str(path), *flags, "-n", str(n), "--temp", "0", "--ctx", "512",
                                  "--threads", "1", "--json", PROMPT])
    assert r.exit_code == 0, r.output
    return json.loads(r.output.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["qwen35_path", "echo_path"], ids=["rejected", "accepted"])
def test_hybrid_lookup_then_the_head_is_plain_decoding(fixture: str, request: pytest.FixtureRequest):
    """--hybrid --draft mtp: labelled lookup+mtp, the head drafts where lookup has no match, and the greedy text
    is --no-spec's on the hybrid target, whether the head's drafts are all rejected (every round rolls the
    recurrent state back) or accepted."""
    path = request.getfixturevalue(fixture)
    spec = _run(path, "--hybrid", "--draft", MTP, "-k", "3", "--no-adaptive")
    plain = _run(path, "--no-spec")
    assert spec["drafter"] == f"lookup+{MTP}" and spec["by_source"][MTP]["draft_n"] > 0
    assert any(s.startswith("lookup") and v["draft_n"] > 0 for s, v in spec["by_source"].items())  # both drafted
    assert spec["text"] == plain["text"]
    if fixture == "echo_path":
        assert spec["by_source"][MTP]["draft_n_accepted"] > 0


@pytest.mark.slow
def test_hybrid_needs_a_drafter_and_mtp_is_one(qwen35_path: Path):
    r = CliRunner().invoke(main, ["run", "--model", str(qwen35_path), "--hybrid", "-n", "2", "--json", PROMPT])
    assert r.exit_code != 0 and "--draft" in r.output


@pytest.mark.slow
def test_bench_gives_the_heads_rows_of_their_own(echo_path: Path, tmp_path: Path):
    """`bench --draft mtp`: plain and mtp rows (no lookup row, as with --draft FILE), the head's c among the
    target's costs, and every greedy mtp run's text the plain run's (agreement records)."""
    out = tmp_path / "b.json"
    r = CliRunner().invoke(main, ["bench", "--model", str(echo_path), "--draft", MTP, "-k", "2", "--tasks", "prose",
                                  "--per-task", "1", "-n", "8", "--ctx", "512", "--threads", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "mtp k=2" in r.output
    d = json.loads(out.read_text())
    (t,) = d["targets"]
    assert t["costs"]["c"][MTP] > 0
    assert {x["config"] for x in d["results"]} == {"plain", "mtp k=2"}
    mtp_runs = [x for x in d["runs"] if x["drafter"] == MTP]
    assert mtp_runs and all(x["draft_n"] > 0 for x in mtp_runs) and any(x["draft_n_accepted"] > 0 for x in mtp_runs)
    agreement = [a for a in d["agreement"] if a["drafter"] == MTP]
    assert len(agreement) == len(mtp_runs) and all(a["agree"] for a in agreement)


@pytest.mark.slow
def test_bench_refuses_mtp_for_a_file_without_heads(smollm2_path: Path):
    r = CliRunner().invoke(main, ["bench", "--model", str(smollm2_path), "--draft", MTP, "-k", "2", "-n", "4"])
    assert r.exit_code != 0 and "no target carries MTP heads" in r.output


@pytest.mark.slow
def test_the_heads_cost_is_calibrated_and_cached(qwen35_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The head's c is timed by the load-time calibration with v(γ), kept in the target's cache entry (its key
    names the head), and read back by the next start; the controller starts from it."""
    from localspec.engine.loader import EngineConfig, load_engine

    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path))
    config = EngineConfig(model=str(qwen35_path), draft=MTP, n_ctx=512, threads=1)
    seen = []
    for _ in range(2):
        engine = load_engine(config, log=lambda *a: None)
        try:
            ctl = engine.controller
            cal = ctl.calibration if isinstance(ctl, Adaptive) else None
            assert cal is not None and cal.costs is not None
            seen.append((cal.cached, cal.costs.c[MTP], ctl.state().c[MTP]))
        finally:
            engine.close()
    (_, c1, ctl1), (_, c2, _) = seen
    assert c1 > 0 and c2 == c1 and ctl1 == pytest.approx(c1)
    keys = [json.loads(p.read_text()).get("key", {}) for p in tmp_path.glob("*.json")]
    assert any(k.get("mtp") == 1 for k in keys)
