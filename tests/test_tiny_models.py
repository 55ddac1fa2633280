"""The tiny recurrent and hybrid models (tests/tiny_gguf.py) load in localspec, are the kind llama.cpp says they
are, decode varied text and decode deterministically: what tests of recurrent-memory handling rely on."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from tiny_gguf import ARCHS, write_tiny

from localspec.backend import LoadOptions, Model

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"
KIND = {"mamba": (True, False), "lfm2": (False, True), "granitehybrid": (False, True),  # (recurrent, hybrid)
        "qwen35": (False, True)}


@pytest.fixture(scope="module")
def tiny_loaded(tiny_recurrent: Path):
    """One tiny model loaded per arch and module, with a small context."""
    m = Model.load(tiny_recurrent, LoadOptions(n_ctx=512))
    yield m
    m.close()


def _arch(m: Model) -> str:
    return m.metadata()["general.architecture"]


def _greedy(m: Model, prompt: list[int], n: int) -> list[int]:
    """n tokens of greedy continuation from an empty memory."""
    m.rewind(0)
    logits = m.decode(prompt)
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = m.decode(out[-1:])
    return out


def test_archs_cover_the_kinds():
    assert set(ARCHS) == set(KIND)


def test_kind_per_llama_cpp(tiny_loaded: Model):
    ptr = tiny_loaded._model.model
    kind = (bool(llama_cpp.llama_model_is_recurrent(ptr)), bool(llama_cpp.llama_model_is_hybrid(ptr)))
    assert kind == KIND[_arch(tiny_loaded)]


def test_tokenizer_is_smollm2s(tiny_loaded: Model, smollm2_target: Model):
    assert tiny_loaded.n_vocab == smollm2_target.n_vocab
    assert tiny_loaded.tokenize(PROMPT) == smollm2_target.tokenize(PROMPT)


def test_greedy_text_varies(tiny_loaded: Model):
    out = _greedy(tiny_loaded, tiny_loaded.tokenize(PROMPT), 30)
    assert len(set(out)) > 3, out


def test_same_tokens_same_logits(tiny_loaded: Model):
    tokens = tiny_loaded.tokenize(PROMPT)
    tokens += _greedy(tiny_loaded, tokens, 8)
    runs = []
    for _ in range(2):
        tiny_loaded.rewind(0)
        assert tiny_loaded.n_past == 0
        rows = np.array(tiny_loaded.decode(tokens, logits_rows=len(tokens)))
        step = np.array(tiny_loaded.decode(tokens[-1:]))  # one more token on top of that state
        runs.append((rows, step))
    assert np.isfinite(runs[0][0]).all()
    assert np.array_equal(runs[0][0], runs[1][0])
    assert np.array_equal(runs[0][1], runs[1][1])


def test_writer_is_deterministic(smollm2_path: Path, tiny_lfm2_path: Path, tmp_path: Path):
    """Same seed, same bytes, in this process or the one that wrote the cached file: a writer changed without a
    new VERSION fails here instead of leaving stale files in the cache."""
    again = write_tiny("lfm2", smollm2_path, tmp_path / "again.gguf")
    assert again.read_bytes() == tiny_lfm2_path.read_bytes()
