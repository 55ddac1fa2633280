"""`localspec models pull` end to end: the real huggingface-hub client against a hub served by this test
(tests/fake_hub.py), which can cut a download mid-file, fail afterwards (a dead network), or lie about a checksum.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner
from fake_hub import CHUNK, COMMIT, FakeHub, block_sockets, write_gguf

from localspec.cli import main
from localspec.models import hub
from localspec.models.hub import HubError, HubRef, quant_of, select_files


@pytest.fixture()
def fake_hub(tmp_path, monkeypatch):
    fh = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", fh.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # the client reads it at import
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # the client writes whole DOWNLOAD_CHUNK_SIZE chunks (10 MB) and drops a partial one when the connection
    # breaks; small chunks put the resume point exactly at a cut in these small files
    monkeypatch.setattr("huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE", CHUNK)
    yield fh
    fh.server.shutdown()


def pull(*args: str):
    return CliRunner().invoke(main, ["models", "pull", *args])


# -- pure: choosing files -------------------------------------------------------------------------------------

def test_quant_tags_from_file_names():
    assert quant_of("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf") == "Q4_K_M"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("x-IQ4_XS.gguf") == "IQ4_XS" and quant_of("x-bf16.gguf") == "BF16"
    assert quant_of("README.gguf") is None


def test_select_files_quant_shards_and_errors():
    names = ["README.md", "m-Q8_0.gguf", "m-q4_k_m-00002-of-00002.gguf", "m-q4_k_m-00001-of-00002.gguf",
             "mmproj-m-f16.gguf"]
    assert select_files(names, HubRef("o/r", quant="Q4_K_M")) == ["m-q4_k_m-00001-of-00002.gguf",
                                                                  "m-q4_k_m-00002-of-00002.gguf"]
    assert select_files(names, HubRef("o/r", quant="q8_0")) == ["m-Q8_0.gguf"]
    assert select_files(names, HubRef("o/r", file="m-Q8_0.gguf")) == ["m-Q8_0.gguf"]
    assert select_files(names, HubRef("o/r")) == select_files(names, HubRef("o/r", quant="Q4_K_M"))  # default
    with pytest.raises(HubError, match="no Q2_K file; quants there: Q4_K_M, Q8_0"):
        select_files(names, HubRef("o/r", quant="Q2_K"))
    with pytest.raises(HubError, match="2 shards but 1"):
        select_files(names[:3], HubRef("o/r", quant="Q4_K_M"))
    with pytest.raises(HubError, match="has no file nope.gguf"):
        select_files(names, HubRef("o/r", file="nope.gguf"))


# -- pull end to end ------------------------------------------------------------------------------------------

def test_pull_resumes_after_the_connection_drops_mid_file(fake_hub, tmp_path):
    data = write_gguf(tmp_path / "src.gguf")
    fake_hub.repos["acme/tiny-GGUF"] = {"tiny-Q4_K_M.gguf": data, "tiny-Q8_0.gguf": data + b"x", "README.md": b"hi"}
    fake_hub.cut["tiny-Q4_K_M.gguf"] = half = 12 * CHUNK
    r = pull("acme/tiny-GGUF:Q4_K_M")
    assert r.exit_code == 0, r.output
    assert fake_hub.ranges("tiny-Q4_K_M.gguf") == [None, f"bytes={half}-"]  # two pieces: the second resumes
    path = hub.cached_path(HubRef("acme/tiny-GGUF", quant="Q4_K_M"))
    assert path.read_bytes() == data and str(path) in r.output
    assert "sha256 verified" in r.output
    assert not fake_hub.ranges("tiny-Q8_0.gguf")  # only the asked quant
    again = pull("acme/tiny-GGUF:Q4_K_M")  # already there: no new GET
    assert again.exit_code == 0 and len(fake_hub.ranges("tiny-Q4_K_M.gguf")) == 2


async def test_router_pull_streams_each_files_bytes_as_they_arrive(fake_hub, tmp_path, monkeypatch):
    """/api/pull's lines (Ollama's format): the byte count grows while the file arrives, under the digest the
    hub gave (its sha256), and reaches the total before "success"."""
    from localspec.router import pulls

    data = write_gguf(tmp_path / "src.gguf", n=200_000)
    fake_hub.repos["acme/tiny-GGUF"] = {"tiny-Q4_K_M.gguf": data}
    monkeypatch.setattr(pulls, "PROGRESS_EVERY_S", 0.0)  # a line for every piece read, not four a second
    pulled: list[bool] = []
    lines = [e async for e in pulls.pull_events("acme/tiny-GGUF:Q4_K_M", lambda: pulled.append(True))]
    sha = hashlib.sha256(data).hexdigest()
    live = [e for e in lines if e.get("digest") == f"sha256:{sha}"]
    assert lines[0] == {"status": "pulling manifest"} and lines[-1] == {"status": "success"} and pulled
    assert len(live) > 2 and all(e["total"] == len(data) and e["status"] == f"pulling {sha[:12]}" for e in live)
    done = [e["completed"] for e in live]
    assert done == sorted(done) and done[0] < len(data) and done[-1] == len(data)


def test_pull_resumes_across_runs_after_a_dead_network(fake_hub, tmp_path):
    data = write_gguf(tmp_path / "src.gguf", n=80_000)
    fake_hub.repos["acme/tiny-GGUF"] = {"tiny-Q4_K_M.gguf": data}
    fake_hub.cut["tiny-Q4_K_M.gguf"] = cut = 20 * CHUNK
    fake_hub.dead_after_cut = True  # every GET after the cut fails: the pull gives up
    r = pull("acme/tiny-GGUF")
    assert r.exit_code == 3 and "run the pull again" in r.output and "Traceback" not in r.output
    parts = list((tmp_path / "hf").rglob("*.localspec.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == cut
    fake_hub.dead_after_cut = False
    r = pull("acme/tiny-GGUF")
    assert r.exit_code == 0, r.output
    assert f"resuming tiny-Q4_K_M.gguf at {cut:,}" in r.output
    assert fake_hub.ranges("tiny-Q4_K_M.gguf")[-1] == f"bytes={cut}-"
    assert hub.cached_path(HubRef("acme/tiny-GGUF")).read_bytes() == data
    assert not list((tmp_path / "hf").rglob("*.localspec.part"))


def test_pull_refuses_a_file_whose_sha256_does_not_match(fake_hub, tmp_path):
    fake_hub.repos["acme/tiny-GGUF"] = {"tiny-Q4_K_M.gguf": write_gguf(tmp_path / "src.gguf")}
    fake_hub.bad_sha.add("tiny-Q4_K_M.gguf")
    r = pull("acme/tiny-GGUF:Q4_K_M")
    assert r.exit_code == 3 and "sha256 mismatch" in r.output
    assert hub.cached_path(HubRef("acme/tiny-GGUF", quant="Q4_K_M")) is None
    assert not list((tmp_path / "hf").rglob("*.localspec.part"))


def test_pull_a_pair_pulls_both_models_and_every_shard(fake_hub, tmp_path):
    a, b = write_gguf(tmp_path / "a.gguf", name="a"), write_gguf(tmp_path / "b.gguf", name="b", n=1000)
    fake_hub.repos["acme/big-GGUF"] = {"big-Q4_K_M-00001-of-00002.gguf": a[:9000],
                                       "big-Q4_K_M-00002-of-00002.gguf": a[9000:]}
    fake_hub.repos["acme/small-GGUF"] = {"small-Q8_0.gguf": b}
    home = tmp_path / "home"
    home.mkdir()
    (home / "models.toml").write_text(
        '[models.big]\nhf = "acme/big-GGUF"\nquant = "Q4_K_M"\n'
        '[models.small]\nhf = "acme/small-GGUF"\nfile = "small-Q8_0.gguf"\n'
        '[pairs.big-small]\ntarget = "big"\ndrafter = "small"\nk = 5\n')
    r = pull("big-small")
    assert r.exit_code == 0, r.output
    assert fake_hub.ranges("big-Q4_K_M-00002-of-00002.gguf") == [None]
    snap = tmp_path / "hf" / "models--acme--big-GGUF" / "snapshots" / COMMIT
    assert sorted(p.name for p in snap.iterdir()) == ["big-Q4_K_M-00001-of-00002.gguf",
                                                       "big-Q4_K_M-00002-of-00002.gguf"]
    from localspec.models.registry import load_registry
    from localspec.models.resolve import resolve_model

    assert resolve_model("big").path.name == "big-Q4_K_M-00001-of-00002.gguf"  # llama.cpp loads the rest
    assert resolve_model("small").path.read_bytes() == b
    assert load_registry().pair_for("big").k == 5
    rm = CliRunner().invoke(main, ["models", "rm", "small"])
    assert rm.exit_code == 0 and "removed" in rm.output
    assert hub.cached_path(HubRef("acme/small-GGUF", file="small-Q8_0.gguf")) is None


def test_pull_unknown_repo_and_quant_say_what_to_do(fake_hub, tmp_path):
    fake_hub.repos["acme/tiny-GGUF"] = {"tiny-Q4_K_M.gguf": b"GGUF"}
    r = pull("acme/nope-GGUF")
    assert r.exit_code == 3 and "repository acme/nope-GGUF not found" in r.output
    r = pull("acme/tiny-GGUF:Q2_K")
    assert r.exit_code == 3 and "quants there: Q4_K_M" in r.output


# -- offline: no socket at all --------------------------------------------------------------------------------

@pytest.mark.slow
def test_offline_run_uses_the_pulled_file_and_opens_no_socket(fake_hub, smollm2_path, monkeypatch):
    # the real SmolLM2 GGUF, served by the fake hub in two pieces; then run with the network forbidden
    repo, name = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf"
    data = smollm2_path.read_bytes()
    fake_hub.repos[repo] = {name: data}
    fake_hub.cut[name] = len(data) // 2
    r = pull(f"{repo}:Q4_1")
    assert r.exit_code == 0, r.output
    assert len(fake_hub.ranges(name)) == 2 and "sha256 verified" in r.output

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # as the client read it at import
    block_sockets(monkeypatch)
    run = CliRunner().invoke(main, ["run", "Hello", "-m", f"{repo}:Q4_1", "-n", "4", "--ctx", "256", "--json"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.output.strip().splitlines()[-1])
    assert out["tokens"] >= 1 and out["model"] == f"{repo}:Q4_1"
    listing = CliRunner().invoke(main, ["models", "list"])
    assert listing.exit_code == 0
    missing = CliRunner().invoke(main, ["run", "hi", "-m", "acme/absent-GGUF:Q4_K_M", "-n", "1"])
    assert missing.exit_code == 2
    assert "not downloaded; run 'localspec models pull acme/absent-GGUF:Q4_K_M'" in missing.output
    refused = pull(f"{repo}:Q4_1")
    assert refused.exit_code == 3 and "HF_HUB_OFFLINE" in refused.output
