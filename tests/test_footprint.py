"""The router's memory estimate (models/footprint.py, router/memory.py) against what llama.cpp allocates: the
buffers its load log reports for a CPU load are the sizes it would put on a device with --ngl -1, so the
estimate is checked here on every build, for an attention model with a small and a large vocabulary and for the
recurrent and hybrid fixtures; the GPU tier checks the device itself (tests/test_gpu.py)."""

from __future__ import annotations

import pytest

from localspec.bench.loadlog import parse_load_log
from localspec.models import footprint as fp

MIB = 2**20


def _shape(arch: str, **kv) -> fp._Shape:
    return fp._Shape({"general.architecture": arch, **{f"{arch}.{k}": v for k, v in kv.items()}}, 1000)


def test_recurrent_layers_follow_each_familys_rule():
    assert _shape("llama", block_count=2, **{"attention.head_count": 4}).recurrent == [False, False]
    assert _shape("mamba", block_count=2, **{"ssm.conv_kernel": 4}).recurrent == [True, True]
    lfm2 = _shape("lfm2", block_count=3, **{"attention.head_count": 4, "attention.head_count_kv": [0, 2, 0],
                                             "shortconv.l_cache": 3})
    assert lfm2.recurrent == [True, False, True]
    qwen = _shape("qwen35", block_count=4, **{"attention.head_count": 4, "full_attention_interval": 4,
                                              "ssm.conv_kernel": 4})
    assert qwen.recurrent == [True, True, True, False]
    nemotron = _shape("nemotron_h", block_count=3, feed_forward_length=[0, 0, 64], **{
        "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0], "ssm.conv_kernel": 4})
    assert nemotron.recurrent == [True, False, False]  # the third is an MLP layer


def test_state_and_kv_count_only_their_own_layers():
    lfm2 = _shape("lfm2", block_count=3, embedding_length=8, **{
        "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0], "shortconv.l_cache": 3})
    assert fp.state_bytes(lfm2) == 2 * 8 * 2 * 4 * fp.STATE_SNAPSHOTS  # llama.cpp rolls lfm2 back itself
    assert fp.kv_bytes(lfm2, 256, None, None) == 256 * 2 * (2 + 2) * 2  # one layer, d = 8 / 4, f16
    mamba = _shape("mamba", block_count=2, embedding_length=8, **{
        "ssm.conv_kernel": 4, "ssm.inner_size": 16, "ssm.state_size": 2})
    assert fp.state_bytes(mamba) == 2 * (3 * 16 + 2 * 16) * 4 * fp.STATE_SEQS and fp.kv_bytes(mamba, 256, 1, 1) == 0


def test_the_state_planes_are_the_contexts_localspec_asks_for():
    from localspec.backend import rollback

    assert fp.STATE_SEQS == 1 + rollback.SLOTS and fp.STATE_SNAPSHOTS == 1 + rollback.RS_DEPTH


def test_the_logits_of_a_batch_bound_the_compute_buffer_from_below(smollm2_path):
    """SmolLM2's 49152-token vocabulary: 512 rows of logits are 96 MiB, more than all else in its graph."""
    f = fp.footprint(smollm2_path, 512)
    assert f.compute >= 512 * 49152 * 4 and f.weights == smollm2_path.stat().st_size
    assert fp.footprint(smollm2_path, 300).kv == f.kv  # llama.cpp pads the context to 256 cells
    assert fp.footprint(smollm2_path, 128).compute < f.compute  # a shorter context is a smaller batch


HYBRID_LOG = """\
llama_model_loader: loaded meta data with 29 key-value pairs and 50 tensors from /m/hybrid.gguf (version GGUF V3 (latest))
load_tensors:          CPU model buffer size =     3.20 MiB
llama_kv_cache:        CPU KV buffer size =     1.50 MiB
llama_kv_cache:        CPU KV buffer size =     0.50 MiB
llama_memory_recurrent:        CPU RS buffer size =     0.02 MiB
sched_reserve:        CPU compute buffer size =    96.13 MiB
llama_kv_cache:        CPU KV buffer size =     0.03 MiB
llama_memory_recurrent:        CPU RS buffer size =     0.06 MiB
"""  # noqa: E501 -- llama.cpp's log lines as it writes them


def test_load_log_parser_adds_up_both_kv_caches_and_reads_the_state():
    """A sliding-window model logs two KV caches; a recurrent or hybrid one its state ("RS"); a later context
    of the same load is not counted."""
    (load,) = parse_load_log(HYBRID_LOG)
    assert load["kv_buffers"] == {"CPU": 2.0} and load["rs_buffers"] == {"CPU": 0.02}
    assert load["compute_buffers"] == {"CPU": 96.13}


def _cpu_buffers(path, n_ctx: int, capsys, **options) -> dict[str, float]:
    """Bytes llama.cpp reports for a CPU load of `path`, by buffer: model, KV cache, recurrent state, compute."""
    from localspec.backend import LoadOptions, Model

    capsys.readouterr()
    Model.load(path, LoadOptions(n_ctx=n_ctx, verbose=True, **options)).close()
    load = parse_load_log(capsys.readouterr().err)[0]
    return {k: sum(load[f"{k}_buffers"].values()) * MIB for k in ("model", "kv", "rs", "compute")}


def _check(path, n_ctx: int, capsys) -> None:
    """Without flash attention (the worst case, as on lavapipe once devicefa.py turns it off) each buffer's
    estimate covers what llama.cpp allocates (the log rounds to 0.01 MiB), and the whole is not more than twice
    what it allocates."""
    used = _cpu_buffers(path, n_ctx, capsys, flash_attn=False)
    f = fp.footprint(path, n_ctx)
    said = f"{path.name} at {n_ctx}: {f} against {used}"
    slack = 0.01 * MIB
    assert f.weights >= used["model"] and f.kv + slack >= used["kv"] and f.state + slack >= used["rs"], said
    assert f.compute >= used["compute"] and f.total <= 2 * sum(used.values()), said


@pytest.mark.slow  # two loads of SmolLM2
@pytest.mark.parametrize("n_ctx", [512, 8192])  # the logits the largest phase, then the attention scores
def test_estimate_covers_smollm2s_buffers(smollm2_path, n_ctx, capsys):
    _check(smollm2_path, n_ctx, capsys)


@pytest.mark.slow  # Gemma 3's 262144-token vocabulary: a 512 MiB compute buffer
def test_estimate_covers_gemmas_buffers(gemma_path, capsys):
    _check(gemma_path, 1024, capsys)


@pytest.mark.slow  # loads each tiny recurrent model
def test_estimate_covers_recurrent_and_hybrid_buffers(tiny_recurrent, capsys):
    _check(tiny_recurrent, 512, capsys)


def test_the_router_puts_the_footprint_where_the_layers_are(smollm2_path):
    from localspec.router.memory import PROCESS_BYTES, estimate

    f = fp.footprint(smollm2_path, 1024)  # all on one side: tests/test_router_pool.py
    half = estimate(smollm2_path, 1024, 16)  # 16 of 31: both sides get a whole compute buffer
    assert half.vram_bytes > f.compute and half.ram_bytes > f.compute + PROCESS_BYTES
    assert half.ram_bytes + half.vram_bytes == f.total + f.compute + PROCESS_BYTES


def test_free_gpu_memory_comes_from_ggmls_devices_before_nvidia_smi(monkeypatch):
    from localspec.router import memory

    monkeypatch.setattr(memory, "nvidia_smi_free_bytes", lambda: 7)
    monkeypatch.setattr(memory, "ggml_free_bytes", lambda: 5 * 2**30)
    assert memory.free_vram_bytes() == 5 * 2**30
    monkeypatch.setattr(memory, "ggml_free_bytes", lambda: None)  # a CPU build lists no GPU
    assert memory.free_vram_bytes() == 7


def test_ggmls_device_list_is_read_in_a_child():
    """This build's devices, as a child process lists them: no GPU on a CPU build (None), else their free memory;
    the router process itself never loads a GPU backend (a CUDA context would hold memory on the GPU)."""
    from localspec.backend.ggml import devices
    from localspec.router.memory import ggml_free_bytes

    gpus = [d for d in devices() if d["type"] in ("GPU", "IGPU") and d["backend"] != "RPC"]
    got = ggml_free_bytes()
    assert (got is None) if not gpus else (0 < got <= sum(d["total"] for d in gpus))
