"""Where the weights live (backend/memory.py): the decision, the real load into huge pages, and that it changes
nothing the model computes."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from localspec.backend import LoadOptions, Model
from localspec.backend.memory import huge_page_bytes, huge_pages_offered, read_into_huge_pages

GIB = 1 << 30
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")


def test_the_user_choice_wins():
    assert read_into_huge_pages(100 * GIB, on_cpu=False, mmap=False, offered=False, available=0)
    assert not read_into_huge_pages(1, on_cpu=True, mmap=True, offered=True, available=GIB)


@linux
def test_read_only_on_the_cpu_with_huge_pages_offered_and_memory_to_spare():
    assert read_into_huge_pages(GIB // 8, on_cpu=True, mmap=None, offered=True, available=GIB)
    assert not read_into_huge_pages(GIB // 8, on_cpu=False, mmap=None, offered=True, available=GIB)  # offloaded
    assert not read_into_huge_pages(GIB // 8, on_cpu=True, mmap=None, offered=False, available=GIB)  # THP never
    assert not read_into_huge_pages(GIB // 2, on_cpu=True, mmap=None, offered=True, available=GIB)  # too large
    assert not read_into_huge_pages(GIB // 8, on_cpu=True, mmap=None, offered=True, available=None)  # unknown


@linux
def test_default_load_puts_the_weights_in_huge_pages(smollm2_path):
    if not huge_pages_offered():
        pytest.skip("this kernel's transparent huge pages are off")
    before, fallbacks = huge_page_bytes(), _thp_fallbacks()
    m = Model.load(smollm2_path, LoadOptions(n_ctx=256))
    try:
        assert m.weights == "read"
        gained = huge_page_bytes() - before
        if gained == 0 and _thp_fallbacks() > fallbacks:
            pytest.skip("the kernel had no free 2 MiB pages for this load (fragmented memory)")
        assert gained >= smollm2_path.stat().st_size // 2  # the weights are ~all of the file
    finally:
        m.close()
    m = Model.load(smollm2_path, LoadOptions(n_ctx=256, mmap=True))
    assert m.weights == "mmap"
    m.close()


def _thp_fallbacks() -> int:
    """Huge-page faults the kernel served with 4 KiB pages instead (machine-wide)."""
    try:
        for line in open("/proc/vmstat"):
            if line.startswith("thp_fault_fallback "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def test_mapped_and_read_weights_give_the_same_logits(smollm2_path):
    rows = []
    for mmap in (True, False):
        m = Model.load(smollm2_path, LoadOptions(n_ctx=256, mmap=mmap))
        try:
            toks = m.tokenize("The quick brown fox", add_special=True, parse_special=False)
            rows.append(np.array(m.decode(toks, 2)))
        finally:
            m.close()
    assert np.array_equal(rows[0], rows[1])


def test_a_gpu_build_maps_its_weights_even_with_every_layer_on_the_cpu(smollm2_path, monkeypatch):
    """On a CUDA build (an H100) localspec's read into huge pages died in llama.cpp's load while its default
    mapped load ran: a GPU build maps, and --no-mmap reads without marking the driver's regions."""
    import llama_cpp

    from localspec.backend import loading

    monkeypatch.setattr(loading, "supports_gpu_offload", lambda: True)
    mparams = llama_cpp.llama_model_default_params()
    assert loading.place_weights(mparams, smollm2_path, LoadOptions(n_gpu_layers=0)) == ("mmap", None)
    assert loading.place_weights(mparams, smollm2_path, LoadOptions(mmap=False)) == ("read", None)
    assert mparams.load_mode == llama_cpp.LLAMA_LOAD_MODE_NONE
