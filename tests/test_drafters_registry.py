"""Registry drafters: models.toml models not downloaded yet are offered for a target (a pair's drafter, then one of
the same hub family), ranked with the local files and the self copy make-drafter would write; `models pull
--drafter-for` pulls the best one, refuses offline with what it would pull, and checks the file it got. Real
GGUFs throughout; the hub is a hand-built cache (offline) or the test's own hub on a local port."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_hub import CHUNK, COMMIT, FakeHub, block_sockets, write_gguf

from localspec.cli import main
from localspec.engine.drafter_choice import choose_drafter
from localspec.engine.loader import EngineConfig
from localspec.models.candidates import family, registry_offers, size_from_text
from localspec.tuning.predict import predict_self_copy, rank_registry

TINY_REPO, TINY_FILE = "acme/SmolTiny-GGUF", "smoltiny-Q4_0.gguf"
KIN_REPO, KIN_FILE = "acme/SmolLM2-360M-Instruct-GGUF", "smollm2-360m-instruct-q4_1.gguf"
BIG = "smol-big"


def registry(home: Path, target: Path) -> None:
    """A target by path, its paired drafter on the hub (not pulled), a same-family model on disk (in the hub
    cache), and two of that family not pulled: one smaller than the target, one larger (no drafter)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(
        f'[models.smol-f16]\npath = "{target}"\n'
        f'[models.smol-tiny]\nhf = "{TINY_REPO}"\nfile = "{TINY_FILE}"\ndescription = "random tiny drafter (7 MB)"\n'
        f'[models.smol-360m]\nhf = "{KIN_REPO}"\nfile = "{KIN_FILE}"\n'
        f'[models.{BIG}]\nhf = "acme/SmolLM2-1.7B-Instruct-GGUF"\nquant = "Q4_K_M"\ndescription = "(~200 MB)"\n'
        '[models.smol-huge]\nhf = "acme/SmolLM2-9B-GGUF"\nquant = "Q4_K_M"\ndescription = "(~5 GB)"\n'
        '[pairs.smol-f16-tiny]\ntarget = "smol-f16"\ndrafter = "smol-tiny"\nk = 4\n')


def cache_file(hub: Path, repo: str, name: str, src: Path) -> Path:
    """A file placed as huggingface-hub places a pulled one: refs/main names the snapshot that holds it."""
    root = hub / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    (snap / name).symlink_to(src)
    return snap / name


@pytest.fixture
def tiny(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """A real, small GGUF with SmolLM2's tokenizer and random weights (~7 MB): a drafter the fake hub can serve."""
    from localspec.models.gguf_tools import write_random_model

    return write_random_model(tmp_path_factory.mktemp("tiny") / TINY_FILE, "tiny", "q4_0", smollm2_path,
                              log=lambda *a: None)


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, smollm2_f16_path: Path) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # the client reads it at import
    monkeypatch.delenv("LOCALSPEC_MODELS_DIR", raising=False)
    target = tmp_path / "target" / "smol-f16.gguf"  # a folder of its own: its self copy is the test's, not the cache's
    target.parent.mkdir()
    target.symlink_to(smollm2_f16_path)
    registry(tmp_path / "home", target)
    cache_file(tmp_path / "hub", KIN_REPO, KIN_FILE, smollm2_path)  # the same file as the package's smollm2-135m
    return tmp_path


def test_family_and_size_from_the_registry_text() -> None:
    assert family("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF") == family("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF")
    assert family("ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF") == family("qwen2.5-coder-0.5b-instruct-q8_0.gguf")
    assert family("SmolLM2-135M-Instruct.F16.gguf") == "smollm2" != family("gemma-3-270m-q4_k_m.gguf")
    assert size_from_text("Qwen2.5-Coder-0.5B-Instruct Q8_0 (~0.5 GB): drafter") == 500_000_000
    assert size_from_text("no size said") is None


def test_registry_offers_pair_then_family(offline: Path) -> None:
    target = offline / "target" / "smol-f16.gguf"
    offers = {o.name: o for o in registry_offers(target)}
    assert {"smol-tiny", BIG} <= set(offers) and "smol-360m" not in offers  # that one is on disk: a local file
    assert "smol-huge" not in offers  # larger than the target: a target of its own
    assert not {"gemma-3-1b-it", "qwen2.5-coder-0.5b-instruct"} & set(offers)  # other families, other pairs
    assert offers["smol-tiny"].paired and "pairs it with smol-f16" in offers["smol-tiny"].why
    assert not offers[BIG].paired and "same family" in offers[BIG].why and offers[BIG].size_bytes == 200_000_000
    ranked = rank_registry(target)
    assert ranked[0].offer.name == "smol-tiny"  # 7 MB: predicted far faster than 200 MB
    speeds = [r.prediction.speedup for r in ranked if r.prediction]
    assert speeds == sorted(speeds, reverse=True) and speeds[-1] < 1
    unknown = [r.offer.name for r in ranked if r.prediction is None]
    assert all(r.prediction is None for r in ranked[len(speeds):]) and all(not offers[n].size_bytes for n in unknown)


def test_drafters_lists_local_registry_and_self_copy_sorted(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block_sockets(monkeypatch)  # the listing reads the disk only
    res = CliRunner().invoke(main, ["models", "drafters", "smol-f16"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    row = {name: next(i for i, ln in enumerate(lines) if name in ln)
           for name in ("smol-tiny", "smollm2-135m ", "self-Q4_0", BIG)}
    assert row["smol-tiny"] < row[BIG] and row["self-Q4_0"] < row[BIG] and row["smollm2-135m "] < row[BIG]
    assert "registry" in lines[row["smol-tiny"]] and "7.0 MB" in lines[row["smol-tiny"]]
    assert "not made yet" in lines[row["self-Q4_0"]] and "own copy" in res.output
    assert "models.toml" in lines[row["smollm2-135m "]] and "same" in lines[row["smollm2-135m "]]
    assert "pull --drafter-for smol-f16" in res.output
    target = offline / "target" / "smol-f16.gguf"
    est, p = predict_self_copy(target) or (0, None)
    assert p is not None and p.self_copy and est < target.stat().st_size / 2


def test_pull_drafter_for_offline_names_what_it_would_pull(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block_sockets(monkeypatch)
    res = CliRunner().invoke(main, ["models", "pull", "--drafter-for", "smol-f16"])
    assert res.exit_code == 3, res.output
    assert "smol-tiny" in res.output and "pairs it with smol-f16" in res.output
    assert "HF_HUB_OFFLINE" in res.output and TINY_REPO in res.output


def test_pull_drafter_for_pulls_checks_and_auto_finds_it(offline: Path, tiny: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    hub = FakeHub()
    try:
        hub.repos[TINY_REPO] = {TINY_FILE: tiny.read_bytes()}
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        monkeypatch.setattr("huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE", CHUNK)
        res = CliRunner().invoke(main, ["models", "pull", "--drafter-for", "smol-f16"])
    finally:
        hub.server.shutdown()
    assert res.exit_code == 0, res.output
    assert hub.ranges(TINY_FILE) == [None] and "sha256 verified" in res.output
    assert "smol-tiny:" in res.output and "predicted" in res.output
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    listed = CliRunner().invoke(main, ["models", "drafters", "smol-f16"]).output.splitlines()
    assert any("smol-tiny" in ln and "models.toml" in ln for ln in listed)
    assert not any("smol-tiny" in ln and "registry" in ln for ln in listed)
    said: list[str] = []
    draft, _ = choose_drafter(EngineConfig(draft="auto"), "smol-f16", offline / "target" / "smol-f16.gguf",
                              log=said.append)
    assert Path(draft).name == TINY_FILE and "smol-tiny" in said[0]


def test_pull_drafter_for_refuses_a_file_with_another_tokenizer(offline: Path, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    hub = FakeHub()
    try:
        hub.repos[TINY_REPO] = {TINY_FILE: write_gguf(tmp_path / "other.gguf")}  # a 64-token vocabulary
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        res = CliRunner().invoke(main, ["models", "pull", "--drafter-for", "smol-f16"])
    finally:
        hub.server.shutdown()
    assert res.exit_code == 2, res.output
    assert "smol-tiny cannot draft for" in res.output and "same tokenizer" in res.output
    assert "'localspec models rm smol-tiny' removes it" in res.output



def test_pull_drafter_for_never_picks_one_predicted_to_lose() -> None:
    from localspec.commands.models import worth_pulling
    from localspec.models.candidates import RegistryOffer
    from localspec.tuning.predict import Offered, Prediction

    def offered(name: str, speedup: float | None, paired: bool = False) -> Offered:
        p = Prediction(speedup, 2, 0.6, 0.1, False, False, False) if speedup is not None else None
        return Offered(RegistryOffer(name, 1 if p else None, paired, "test"), p)

    ranked = [offered("fast", 1.4), offered("slow", 0.3), offered("family", None), offered("pair", None, True)]
    assert [r.offer.name for r in worth_pulling(ranked)] == ["fast", "pair", "family"]
    assert worth_pulling([offered("slow", 0.3)]) == []
