"""The GPU check's pieces (scripts/gpu_check.sh): the load-log parser (localspec/bench/loadlog.py), the random-weight
models (localspec/models/gguf_tools.py), and (marked `gpu`, skipped where llama.cpp was built without GPU offload)
placement, greedy agreement and v(γ) on a real GPU.

The GPU check runs this file on the device (phase 1) with GPU_CHECK_TOKENIZER pointing at the carried SmolLM2
tokenizer, since the device cannot fetch the model; elsewhere the tokenizer comes from the embedded SmolLM2.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from localspec.bench.loadlog import parse_load_log, placement_ok
from localspec.models import gguf_tools


def _gpu_offload() -> bool:
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:
        return False


needs_gpu = pytest.mark.skipif(not _gpu_offload(), reason="llama.cpp built without GPU offload")


@pytest.fixture(scope="module")
def tokenizer_gguf(tmp_path_factory) -> Path:
    env = os.environ.get("GPU_CHECK_TOKENIZER")
    if env:
        return Path(env)
    from localspec.models.resolve import resolve_model

    smol = resolve_model(None, log=lambda *a: None).path
    return gguf_tools.write_tokenizer(smol, tmp_path_factory.mktemp("tok") / "tok.gguf")


@pytest.fixture(scope="module")
def tiny_model(tokenizer_gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "tiny.gguf"
    return gguf_tools.write_random_model(out, "tiny", "q4_k", tokenizer_gguf, log=lambda *a: None)


CUDA_LOG = """\
llama_model_loader: loaded meta data with 26 key-value pairs and 20 tensors from /m/big.gguf (version GGUF V3 (latest))
load_tensors: layer   0 assigned to device CUDA0, is_swa = 0
load_tensors: layer   1 assigned to device CUDA0, is_swa = 0
load_tensors: layer   2 assigned to device CUDA0, is_swa = 0
load_tensors: offloading output layer to GPU
load_tensors: offloaded 3/3 layers to GPU
load_tensors:   CPU_Mapped model buffer size =    27.00 MiB
load_tensors:        CUDA0 model buffer size =  4096.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB
sched_reserve:      CUDA0 compute buffer size =   300.00 MiB
llama_kv_cache:        CPU KV buffer size =    90.00 MiB
llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors from /m/small.gguf (version GGUF V3 (latest))
load_tensors: layer   0 assigned to device CPU, is_swa = 0
load_tensors: layer   1 assigned to device CUDA0, is_swa = 0
load_tensors: offloaded 1/2 layers to GPU
load_tensors:          CPU model buffer size =    92.10 MiB
llama_kv_cache:        CPU KV buffer size =    90.00 MiB
"""  # noqa: E501 -- llama.cpp's log lines as it writes them


def test_load_log_parser_reads_placement_per_load():
    big, small = parse_load_log(CUDA_LOG)
    assert big["path"] == "/m/big.gguf" and big["offloaded"] == [3, 3]
    assert big["layer_devices"] == {"CUDA0": 3} and big["kv_buffers"] == {"CUDA0": 256.0}  # later contexts ignored
    assert big["model_buffers"] == {"CPU_Mapped": 27.0, "CUDA0": 4096.0}
    assert placement_ok(big, gpu=True)[0]
    assert small["layer_devices"] == {"CPU": 1, "CUDA0": 1}
    assert not placement_ok(small, gpu=True)[0]  # a layer and the KV cache stayed on the CPU
    assert not placement_ok(small, gpu=False)[0]


def test_agreement_counts_the_common_prefix():
    from localspec.speculative.drafters import common_prefix

    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2


@pytest.mark.slow  # writing the random-weight model (the module's fixture) takes ~20 s
def test_random_model_has_the_shape_and_the_smollm2_tokenizer(tiny_model, tokenizer_gguf, capsys):
    import gguf

    from localspec.backend import LoadOptions, Model

    r = gguf.GGUFReader(str(tiny_model))
    assert r.get_field("llama.block_count").contents() == gguf_tools.SHAPES["tiny"].n_layer
    tok = gguf.GGUFReader(str(tokenizer_gguf))
    tokens = "tokenizer.ggml.tokens"
    assert r.get_field(tokens).contents()[:50] == tok.get_field(tokens).contents()[:50]
    m = Model.load(tiny_model, LoadOptions(n_ctx=256, verbose=True))
    try:
        assert m.n_vocab == 49152
        logits = m.decode(m.tokenize("The quick brown fox", add_special=False), 1)
        assert np.isfinite(logits).all()  # the scales keep activations finite through every layer
    finally:
        m.close()
    loads = parse_load_log(capsys.readouterr().err)
    assert loads and Path(loads[0]["path"]).name == tiny_model.name and loads[0]["n_layers"] == 3  # + the output layer


@pytest.mark.slow  # writing the random-weight model (the module's fixture) takes ~20 s
def test_random_model_pairs_with_smollm2(tiny_model):
    if os.environ.get("GPU_CHECK_TOKENIZER"):
        pytest.skip("the device has no whole SmolLM2 in phase 1")
    from localspec.models.pairing import check_pair
    from localspec.models.resolve import resolve_model

    assert check_pair(tiny_model, resolve_model(None, log=lambda *a: None).path) == []


def test_shapes_are_real_sizes():
    n = {s: gguf_tools.n_params(gguf_tools.SHAPES[s], 49152) / 1e9 for s in ("1b", "8b")}
    assert 0.9 < n["1b"] < 1.3 and 6.5 < n["8b"] < 8.0


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_gpu_offload_places_every_layer_and_the_kv_cache(tiny_model, capsys):
    from localspec.backend import LoadOptions, Model, devices

    assert any("CUDA" in str(d) for d in devices())
    m = Model.load(tiny_model, LoadOptions(n_ctx=256, n_gpu_layers=-1, verbose=True))
    m.close()
    load = parse_load_log(capsys.readouterr().err)[0]
    ok, how = placement_ok(load, gpu=True)
    assert ok, how


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_gpu_logits_match_the_cpu(tiny_model):
    from localspec.backend import LoadOptions, Model

    def logits(ngl: int) -> np.ndarray:
        m = Model.load(tiny_model, LoadOptions(n_ctx=256, n_gpu_layers=ngl))
        try:
            return np.array(m.decode(m.tokenize("Once upon a time", add_special=False), 1)[-1], dtype=np.float64)
        finally:
            m.close()

    gpu, cpu = logits(-1), logits(0)
    assert np.corrcoef(gpu, cpu)[0, 1] > 0.99  # the kernels differ (and round activations differently), not the model
    assert int(np.argmax(gpu)) in np.argsort(cpu)[-5:]  # greedy text over many tokens: scripts/gpu_check.py


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_gpu_verify_rows_are_cheap(tiny_model):
    from localspec.backend import LoadOptions, Model
    from localspec.tuning import costs

    m = Model.load(tiny_model, LoadOptions(n_ctx=512, n_gpu_layers=-1))
    try:
        c = costs.measure(m, costs.probe_tokens(m, 64), 16, lookup=True, repeats=3)
    finally:
        m.close()
    v = c.v_by_gamma
    assert all(np.isfinite(x) and x >= 1.0 for x in v.values())
    assert v[16] < 8  # 17 rows in one pass cost far less than 17 passes on a GPU
