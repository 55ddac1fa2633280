"""The GPU check's pieces (scripts/gpu/gpu_check.sh, scripts/gpu/vulkan_build.sh): the load-log parser
(localspec/bench/loadlog.py), the random-weight models (localspec/models/gguf_tools.py), where a model runs
(backend/ggml.placement) and flash attention's test on a device (backend/devicefa.py); and, marked `gpu` and
skipped where ggml has no GPU device, the GPU tier on whatever device there is (CUDA0, Metal, Vulkan0 - Mesa's
lavapipe on a machine without a GPU): layers and KV cache placed as asked (target on the device and drafter on
the CPU, and the other way round), greedy speculation == plain decoding, the router's memory estimate against
the device's free memory, `models show --device` and `run --verbose` naming the device. Correctness and
placement only, never speed: lavapipe is 40-50x slower than the CPU backend.

The GPU check runs this file on the device (phase 1) with GPU_CHECK_TOKENIZER pointing at the carried SmolLM2
tokenizer, since the device cannot fetch the model; elsewhere the tokenizer comes from the embedded SmolLM2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localspec.bench.loadlog import on_cpu, parse_load_log, placement_ok
from localspec.models import gguf_tools


def _gpu_device() -> dict | None:
    """The first local GPU device ggml has (CUDA0, Metal, Vulkan0, ...), else None (a CPU build, or one whose
    only offload target is an RPC server)."""
    try:
        from localspec.backend.ggml import devices, supports_gpu_offload

        if not supports_gpu_offload():
            return None
        return next((d for d in devices() if d["type"] in ("GPU", "IGPU") and d["backend"] != "RPC"), None)
    except Exception:
        return None


GPU = _gpu_device()
needs_gpu = pytest.mark.skipif(GPU is None, reason="ggml has no GPU device here (llama.cpp built without one, or "
                               "no device: on lavapipe set GGML_VK_VISIBLE_DEVICES=0, scripts/gpu/vulkan_build.sh)")


@pytest.fixture(scope="module")
def tokenizer_gguf(tmp_path_factory) -> Path:
    env = os.environ.get("GPU_CHECK_TOKENIZER")
    if env:
        return Path(env)
    from localspec.models.resolve import resolve_model

    smol = resolve_model(None, log=lambda *a: None).path
    return gguf_tools.write_tokenizer(smol, tmp_path_factory.mktemp("tok") / "tok.gguf")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M Q4_1. On the GPU machine it cannot be fetched and is too large for one call: it travels in
    the check's second call (GPU_CHECK_SMOLLM2), so the first call skips the tests that need it; elsewhere it
    is the embedded default, as in conftest.py."""
    env = os.environ.get("GPU_CHECK_SMOLLM2")
    if env:
        path = Path(env)
    elif os.environ.get("GPU_CHECK_TOKENIZER"):
        pytest.skip("SmolLM2 travels in the GPU check's second call (GPU_CHECK_SMOLLM2)")
    else:
        from localspec.models.resolve import resolve_model

        path = resolve_model(None, log=lambda *a: None).path
    from localspec.backend import fastpath

    fastpath.choose(path)  # the CPU fast paths' verdict said once, here, not by the commands the tests run
    return path


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
def test_random_model_pairs_with_smollm2(tiny_model, smollm2_path):
    from localspec.models.pairing import check_pair

    assert check_pair(tiny_model, smollm2_path) == []


def test_shapes_are_real_sizes():
    n = {s: gguf_tools.n_params(gguf_tools.SHAPES[s], 49152) / 1e9 for s in ("1b", "8b")}
    assert 0.9 < n["1b"] < 1.3 and 6.5 < n["8b"] < 8.0


VULKAN_LOG = """\
llama_model_load_from_file_impl: using device Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)) (unknown id) - 2048 MiB free
llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors from /m/smol.gguf (version GGUF V3 (latest))
load_tensors: layer   0 assigned to device Vulkan0, is_swa = 0
load_tensors: layer   1 assigned to device Vulkan0, is_swa = 0
load_tensors: offloading output layer to GPU
load_tensors: offloaded 2/2 layers to GPU
load_tensors:   CPU_Mapped model buffer size =    28.12 MiB
load_tensors:      Vulkan0 model buffer size =    70.00 MiB
llama_kv_cache:      Vulkan0 KV buffer size =     5.62 MiB
sched_reserve:      Vulkan0 compute buffer size =    97.00 MiB
sched_reserve: Vulkan_Host compute buffer size =     2.50 MiB
llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors from /m/draft.gguf (version GGUF V3 (latest))
load_tensors: layer   0 assigned to device CPU, is_swa = 0
load_tensors: layer   1 assigned to device CPU, is_swa = 0
load_tensors: offloaded 0/2 layers to GPU
load_tensors:   CPU_Mapped model buffer size =    98.12 MiB
llama_kv_cache:        CPU KV buffer size =     5.62 MiB
"""  # noqa: E501 -- llama.cpp's log lines as it writes them


def test_load_log_parser_reads_any_backends_device_names():
    smol, draft = parse_load_log(VULKAN_LOG)
    assert smol["devices"] == {"Vulkan0": {"description": "llvmpipe (LLVM 15.0.6, 256 bits)", "free_mib": 2048}}
    assert placement_ok(smol, gpu=True)[0] and placement_ok(smol, gpu=True, device="Vulkan0")[0]
    assert not placement_ok(smol, gpu=True, device="CUDA0")[0]
    assert draft["devices"] == {} and placement_ok(draft, gpu=False)[0] and not placement_ok(draft, gpu=True)[0]
    lines = VULKAN_LOG.splitlines(keepends=True)  # llama.cpp 0.3.36 says "using device" after the metadata
    assert parse_load_log("".join([lines[1], lines[0], *lines[2:]]))[0]["devices"] == smol["devices"]
    metal = parse_load_log(VULKAN_LOG.replace("Vulkan0", "MTL0").replace("Vulkan_Host", "MTL0_Host"))[0]
    assert placement_ok(metal, gpu=True, device="MTL0")[0]
    assert on_cpu("CPU_REPACK") and on_cpu("CUDA_Host") and on_cpu("AMX") and not on_cpu("Vulkan0")


def test_placement_says_where_a_model_runs(monkeypatch):
    from localspec.backend import ggml

    assert ggml.placement_text(ggml.placement(-1, 30, ())) == "cpu"  # no device to offload to
    assert ggml.placement_text(ggml.placement(0, 30, ("Vulkan0",))) == "cpu"
    monkeypatch.setattr(ggml, "supports_gpu_offload", lambda: True)
    assert ggml.placement(-1, 30, ("Vulkan0",)) == {"device": "gpu", "layers": [31, 31], "devices": ["Vulkan0"]}
    assert ggml.placement_text(ggml.placement(-1, 30, ("Vulkan0",))) == "gpu 31/31 layers Vulkan0"
    assert ggml.placement_text(ggml.placement(12, 30, ("CUDA0", "CUDA1"))) == "gpu 12/31 layers CUDA0+CUDA1"


@pytest.mark.slow  # loads SmolLM2 twice
def test_flash_attention_crash_on_a_device_turns_it_off_there_once(smollm2_path, monkeypatch):
    """A test that dies (faked here: the CPU build has no device) turns flash attention off, in one line that names
    the device and not the CPU's fast paths; the verdict is cached per device and build, said once a process."""
    from localspec.backend import LoadOptions, Model, devicefa

    tests = []
    monkeypatch.setattr(devicefa, "_told", set())
    monkeypatch.setattr(devicefa, "gpu_devices", lambda m: ("Vulkan0",))
    monkeypatch.setattr(devicefa, "_describe", lambda names: f"{names[0]} (fake-{os.getpid()})")
    monkeypatch.setattr(devicefa, "run_test", lambda *a: tests.append(a) or "SIGSEGV")
    said: list[str] = []
    for source in ("probe", "cache"):
        m = Model.load(smollm2_path, LoadOptions(n_ctx=256))
        try:
            v = devicefa.settle(m, said.append)
            assert v is not None and not v.ok and v.source == source and m.options.flash_attn is False
            assert m.decode(m.tokenize("Hello", add_special=False), 1).shape[-1] == m.n_vocab
        finally:
            m.close()
    assert len(tests) == 1 and len(said) == 1
    assert "flash attention crashed a test on Vulkan0" in said[0] and "SIGSEGV" in said[0] and "AMX" not in said[0]
    chosen = Model.load(smollm2_path, LoadOptions(n_ctx=256, flash_attn=True))  # the user's choice stands
    try:
        assert devicefa.check(chosen) is None and chosen.options.flash_attn is True
    finally:
        chosen.close()


@pytest.mark.slow  # a child process loads SmolLM2
def test_flash_attention_test_runs_in_a_child(smollm2_path):
    from localspec.backend import LoadOptions, Model, devicefa

    assert devicefa.run_test(smollm2_path, 0, "none", 120) is None  # the CPU's flash attention survives it
    m = Model.load(smollm2_path, LoadOptions(n_ctx=128))
    try:
        assert devicefa.gpu_devices(m) == () and devicefa.check(m) is None  # a CPU model: nothing to test
    finally:
        m.close()


def test_too_large_warning_on_two_devices_uses_measured_costs(smollm2_path, smollm2_f16_path, tmp_path,
                                                              monkeypatch):
    """Target on a GPU, drafter on the CPU: file sizes (c 2.8 for the F16 copy) say nothing, so only a
    calibration made with that placement judges before the load, else the load's own calibration after it."""
    from types import SimpleNamespace

    from localspec.engine import drafter_choice

    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path))
    monkeypatch.setattr(drafter_choice, "split_devices", lambda ngl, ngl_draft: bool(ngl) != bool(ngl_draft))
    said: list[str] = []
    warn = drafter_choice.warn_if_too_large
    assert warn(smollm2_path, smollm2_f16_path, "F16", log=said.append, ngl=-1, ngl_draft=0) is False and not said
    assert warn(smollm2_path, smollm2_f16_path, "F16", log=said.append, ngl=-1, ngl_draft=-1) is True
    assert len(said) == 1 and "from file sizes" in said[0]  # one device: the sizes judge
    said.clear()

    def file_id(p: Path) -> dict:
        st = p.stat()
        return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    entry = {"key": {"target": file_id(smollm2_path), "draft": file_id(smollm2_f16_path), "ngl": -1, "draft_ngl": 0},
             "calibration": {"costs": {"v": {"1": 1.1, "2": 1.2, "4": 1.4, "8": 1.8}, "c": {"model": 0.05}}}}
    (tmp_path / "placed.json").write_text(json.dumps(entry))
    assert warn(smollm2_path, smollm2_f16_path, "F16", log=said.append, ngl=-1, ngl_draft=0) is True and not said
    assert warn(smollm2_path, smollm2_f16_path, "F16", log=said.append, ngl=-1, ngl_draft=-1) and said  # not here

    said.clear()
    for c, warned in ((0.05, False), (1.5, True)):
        state = SimpleNamespace(c={"model": c}, v=(1.0, 1.1, 1.2, 1.3, 1.4))
        engine = SimpleNamespace(controller=SimpleNamespace(state=lambda state=state: state),
                                 target=SimpleNamespace(path=smollm2_path))
        drafter_choice.warn_if_measured_too_large(engine, "F16", log=said.append)
        assert bool(said) == warned
    assert "c 1.50 measured" in said[0] and "different devices" in said[0]


def test_crash_line_names_what_the_child_ran_on_a_device():
    """A child that noted its suspect (flash attention on a device) and then crashed is named in its parent's
    crash line, once; without a note the line names the CPU's fast paths as before."""
    import signal

    from localspec import crash

    code = ("import os, signal; from localspec.crash import note_suspect; "
            "note_suspect('flash attention on Vulkan0', '--flash-attn off'); os.kill(os.getpid(), signal.SIGSEGV)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert child.returncode == -signal.SIGSEGV
    pid = int(next(Path(crash.tempfile.gettempdir()).glob(f"localspec-suspect-{os.getpid()}-*")).name.split("-")[-1])
    line = crash.crash_line(signal.SIGSEGV, pid)
    assert "most likely in flash attention on Vulkan0: try again with --flash-attn off" in line and "AMX" not in line
    assert "AMX" in crash.crash_line(signal.SIGSEGV, pid) == crash.crash_line(signal.SIGSEGV)  # read once


# -- the GPU tier: any GGML GPU device, checked for placement and correctness, never speed ----------------------

def _load(path, log_into: list | None = None, **kw):
    from localspec.backend import LoadOptions, Model, devicefa

    m = Model.load(path, LoadOptions(**{"n_ctx": 512, **kw}))
    devicefa.settle(m, (log_into if log_into is not None else []).append)
    return m


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_gpu_offload_places_every_layer_and_the_kv_cache(tiny_model, capsys):
    m = _load(tiny_model, n_ctx=256, n_gpu_layers=-1, verbose=True)
    m.close()
    load = parse_load_log(capsys.readouterr().err)[0]
    ok, how = placement_ok(load, gpu=True, device=GPU["name"])
    assert ok, how
    assert GPU["name"] in load["devices"]  # llama.cpp's "using device ..." line


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_gpu_logits_match_the_cpu(tiny_model):
    def logits(ngl: int) -> np.ndarray:
        m = _load(tiny_model, n_ctx=256, n_gpu_layers=ngl)
        try:
            return np.array(m.decode(m.tokenize("Once upon a time", add_special=False), 1)[-1], dtype=np.float64)
        finally:
            m.close()

    gpu, cpu = logits(-1), logits(0)
    assert np.corrcoef(gpu, cpu)[0, 1] > 0.99  # the kernels differ (and round activations differently), not the model
    assert int(np.argmax(gpu)) in np.argsort(cpu)[-5:]  # greedy text over many tokens: scripts/gpu/gpu_check.py


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_gpu_cost_curve_is_measured(tiny_model):
    """v(γ) measured on the device (how cheap it is there is gpu_check.py's report, not a test)."""
    from localspec.tuning import costs

    m = _load(tiny_model, n_gpu_layers=-1)
    try:
        c = costs.measure(m, costs.probe_tokens(m, 64), 8, lookup=True, repeats=2)
    finally:
        m.close()
    assert set(c.v_by_gamma) >= {1, 8} and all(np.isfinite(x) and x > 0 for x in c.v_by_gamma.values())


PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ")


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
@pytest.mark.parametrize("ngl, ngl_draft", [(-1, 0), (0, -1)], ids=["target-on-device", "drafter-on-device"])
def test_speculation_across_devices_is_placed_as_asked_and_lossless(smollm2_path, tiny_model, ngl, ngl_draft,
                                                                   capsys):
    """SmolLM2 as the target and the random tiny model (same tokenizer) as its drafter, one on the device and the
    other on the CPU: each model's layers and KV cache where it was asked, and greedy speculation's text equal
    to plain decoding's on the same target."""
    from localspec.engine.engine import Engine
    from localspec.speculative.drafters import ModelDrafter
    from localspec.tuning.fixed import FixedK

    target = _load(smollm2_path, n_gpu_layers=ngl, verbose=True)
    draft = _load(tiny_model, n_gpu_layers=ngl_draft, verbose=True)
    t_load, d_load = parse_load_log(capsys.readouterr().err)[:2]
    try:
        for load, n in ((t_load, ngl), (d_load, ngl_draft)):
            ok, how = placement_ok(load, gpu=n != 0, device=GPU["name"] if n else None)
            assert ok, f"{Path(load['path']).name}: {how}"
        eng = Engine(target, ModelDrafter(draft), controller=FixedK(3))
        for p in PROMPTS:
            plain = "".join(c.text for c in eng.generate(p, max_tokens=16, speculate=False))
            spec = [c for c in eng.generate(p, max_tokens=16)]
            assert "".join(c.text for c in spec) == plain
            assert spec[-1].stats.draft_n > 0  # it did speculate
    finally:
        draft.close()
        target.close()


def _device_use(path, n_ctx: int, capsys) -> tuple[int, dict]:
    """(bytes llama.cpp put on the GPU device for `path` at `n_ctx`: weights, KV cache, compute; the load)."""
    m = _load(path, n_ctx=n_ctx, n_gpu_layers=-1, verbose=True)
    m.close()
    load = parse_load_log(capsys.readouterr().err)[0]
    name = GPU["name"]
    mib = sum(b.get(name, 0.0) for b in (load["model_buffers"], load["kv_buffers"], load["rs_buffers"],
                                         load["compute_buffers"]))
    return int(mib * 2**20), load


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_router_memory_estimate_against_the_device(smollm2_path, capsys):
    """The router's estimate of a runner's GPU memory fits the device's free memory, as does what llama.cpp
    really put there (from its load log); with every layer offloaded the RAM side is the process allowance."""
    from localspec.backend.ggml import devices
    from localspec.router.memory import PROCESS_BYTES, estimate

    free = next(d["free"] for d in devices() if d["name"] == GPU["name"])
    est = estimate(smollm2_path, 512, -1)
    used, load = _device_use(smollm2_path, 512, capsys)
    assert 0 < est.vram_bytes <= free and 0 < used <= free, (est, used, free)
    assert est.ram_bytes == PROCESS_BYTES
    assert load["devices"][GPU["name"]]["free_mib"] * 2**20 <= GPU["total"]  # llama.cpp read the same device


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_router_memory_estimate_covers_what_the_device_holds(smollm2_path, capsys):
    """Weights, KV cache and compute buffer on the device, under the estimate (on the CPU the same sizes are
    checked for more models: tests/test_footprint.py)."""
    from localspec.router.memory import estimate

    used, _ = _device_use(smollm2_path, 512, capsys)
    assert used <= estimate(smollm2_path, 512, -1).vram_bytes


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALSPEC_NO_WATCH": "1"}
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpu
def test_models_show_and_run_name_the_device(smollm2_path, tiny_model):
    name = GPU["name"]
    r = _cli("models", "show", "--device", "--json")
    assert r.returncode == 0, r.stderr
    shown = {d["name"]: d for d in json.loads(r.stdout)["device"]["devices"]}
    assert name in shown and shown[name]["total"] > 0

    r = _cli("run", "--model", str(smollm2_path), "--no-spec", "--ngl", "-1", "--threads", "2", "--verbose",
             "-n", "4", "The capital of France is")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"using device {name}" in r.stderr  # llama.cpp's load log
    assert re.search(rf"\| target gpu (\d+)/\1 layers {name}$", r.stderr, re.M), r.stderr[-1000:]
    assert "AMX" not in r.stderr  # a flash-attention crash on the device is named as one

    r = _cli("run", "--model", str(smollm2_path), "--draft", str(tiny_model), "--ngl", "-1", "--ngl-draft", "0",
             "--threads", "2", "--no-adaptive", "-k", "3", "--json", "-n", "8", "The capital of France is")
    assert r.returncode == 0, r.stderr[-2000:]
    where = json.loads(r.stdout)["placement"]
    assert where["target"]["device"] == "gpu" and where["target"]["devices"] == [name]
    assert where["target"]["layers"][0] == where["target"]["layers"][1] and where["drafter"] == {"device": "cpu"}
