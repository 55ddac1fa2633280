"""llama.cpp's optional CPU fast paths (backend/fastpath.py): a trial in a child process decides, per model
layout, CPU and build, which extra buffer types a model loads with; a child that dies by a signal, hangs or
computes other logits than the reference path sends the load to the next mode. The deaths are real: the child
kills itself through its test hook (LOCALSPEC_PROBE_FAULT, tests/faults/probe.py), after its load, as a broken
kernel would; nothing in the decision is mocked. Mismatches: test_fastpath_trial.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from faults import probe
from faults.probe import FAULT_ENV

from localspec.backend import LoadOptions, Model, fastpath, fastpath_cache

pytestmark = pytest.mark.slow


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    """An empty verdict cache, and no fault unless a test sets one (the trials, children, get this process's
    path, which holds the fault hook's folder)."""
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path))
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.syspath_prepend(str(probe.HERE))
    return tmp_path


def _greedy(path, mode: str, n: int = 12) -> list[int]:
    m = Model.load(path, LoadOptions(n_ctx=256, fast_path=mode))
    try:
        out = m.tokenize("The capital of France is Paris. The capital of Germany is")
        for _ in range(n):
            out.append(int(np.argmax(m.decode(out[-1:] if m.n_past else out, 1)[0])))
        return out
    finally:
        m.close()


def test_a_working_build_keeps_every_fast_path_and_caches_the_verdict(verdicts, smollm2_path):
    """On a machine where this build's fast paths work, every one is kept; where one really crashes (llama.cpp's
    AMX kernels on a Xeon with AMX: docs/bench/fastpath.md), the probe finds it and says so. Either way the
    verdict is cached and the next load uses it."""
    first = fastpath.choose(smollm2_path)
    if first.failures:  # a real crash on this machine, not a test hook's
        assert first.mode in ("repack", "none") and first.source == "probe" and first.notice()
    else:
        assert (first.mode, first.source) == ("all", "probe") and first.notice() is None
        assert first.distance is not None and first.distance <= fastpath.TOLERANCE
    assert first.seconds > 0
    again = fastpath.choose(smollm2_path)
    assert (again.mode, again.source, again.distance) == (first.mode, "cache", first.distance)
    m = Model.load(smollm2_path, LoadOptions(n_ctx=64))
    assert m.fast_path.source == "cache" and m.fast_path.mode == first.mode
    m.close()
    assert len(list(verdicts.glob("fastpath-*.json"))) == 1


def test_sigill_with_every_extra_type_keeps_cpu_repack_alone(verdicts, gemma_path, monkeypatch):
    """Gemma-3-270M has Q4_K weights that CPU_REPACK takes: after a SIGILL in mode all (AMX's crash), mode
    repack places exactly those on CPU_REPACK through tensor overrides, and decodes as the default does."""
    monkeypatch.setenv(FAULT_ENV, "all:SIGILL")
    plan = fastpath.choose(gemma_path)
    assert plan.mode == "repack" and plan.failures == (("all", "SIGILL"),)
    assert plan.repacked and all(".weight" in n and "token_embd" not in n for n in plan.repacked)
    assert "SIGILL" in plan.notice() and "CPU_REPACK alone" in plan.notice()
    m = Model.load(gemma_path, LoadOptions(n_ctx=64))
    assert m.fast_path.mode == "repack" and m.fast_path.source == "cache"
    m.close()
    monkeypatch.delenv(FAULT_ENV)
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(verdicts / "real"))
    all_works = not fastpath.choose(gemma_path).failures  # mode all crashes for real on a Xeon with AMX
    repack, plain = (_greedy(gemma_path, mode) for mode in ("repack", "none"))
    if all_works:
        assert repack == _greedy(gemma_path, "all")  # the same tensors on the same kernels
    # other kernels sum in another order: a near-tie late in the text may go either way (seen at token 11 of 12)
    assert repack[:-6] == plain[:-6]


def test_a_load_that_finds_a_crash_loads_again_without_it(verdicts, gemma_path, monkeypatch):
    """The model loads while its trial runs; when the trial dies, the model is loaded again."""
    monkeypatch.setenv(FAULT_ENV, "all:SIGILL")
    m = Model.load(gemma_path, LoadOptions(n_ctx=64))
    try:
        assert (m.fast_path.mode, m.fast_path.source) == ("repack", "probe")
        assert m.fast_path.failures == (("all", "SIGILL"),)
        assert m.decode(m.tokenize("Hello"), 1).shape == (1, m.n_vocab)
    finally:
        m.close()


def test_sigsegv_in_every_mode_loads_without_extra_types(verdicts, gemma_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "all:SIGSEGV,repack:SIGSEGV")
    plan = fastpath.choose(gemma_path)
    assert plan.mode == "none" and plan.failures == (("all", "SIGSEGV"), ("repack", "SIGSEGV"))
    assert "without extra buffer types" in plan.notice()


def test_a_hung_test_load_times_out(verdicts, smollm2_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "all:hang")
    monkeypatch.setenv(fastpath.TIMEOUT_ENV, "3")
    plan = fastpath.choose(smollm2_path)
    assert plan.mode == "none" and plan.failures == (("all", "timed out after 3 s"),)


def test_a_new_llama_cpp_build_is_tested_again(verdicts, smollm2_path, monkeypatch):
    assert fastpath.choose(smollm2_path).source == "probe"
    assert fastpath.choose(smollm2_path).source == "cache"
    monkeypatch.setattr(fastpath_cache, "build_info", lambda: "llama-cpp-python 9.9.9; CPU : AMX_INT8 = 1 |")
    assert fastpath.choose(smollm2_path).source == "probe"


def test_the_users_choice_is_not_tested(verdicts, smollm2_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "all:SIGILL")
    for mode in ("all", "none"):
        plan = fastpath.choose(smollm2_path, mode=mode)
        assert (plan.mode, plan.source, plan.failures) == (mode, "option", ())
    assert not list(verdicts.glob("fastpath-*.json"))


def test_offloading_every_layer_leaves_nothing_to_test(verdicts, smollm2_path, monkeypatch):
    monkeypatch.setattr(fastpath, "supports_gpu_offload", lambda: True)
    assert fastpath.choose(smollm2_path, n_gpu_layers=-1).source == "default"


def test_repack_rule_and_patterns():
    f = {"AVX2"}
    assert fastpath.repacks("Q4_K", 1024, f) and fastpath.repacks("Q4_0", 64, f)
    assert not fastpath.repacks("Q4_1", 1024, f) and not fastpath.repacks("Q4_K", 1020, f)
    assert not fastpath.repacks("Q6_K", 1024, f) and fastpath.repacks("Q6_K", 1024, {"NEON", "DOTPROD"})
    pats = fastpath.tensor_patterns(["blk.0.ffn_down.weight", "blk.12.ffn_down.weight", "output.weight"])
    assert pats == [r"^blk\.(0|12)\.ffn_down\.weight$", r"^output\.weight$"]


# -- the command line ---------------------------------------------------------------------------------------------

def _localspec(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, stdin=subprocess.DEVNULL)


def test_run_says_once_what_was_switched_off(verdicts):
    r = _localspec("run", "-n", "4", "--temp", "0", "--no-spec", "hi", env=probe.env("all:SIGILL"))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "fast paths" in ln]
    assert len(lines) == 1 and "SIGILL" in lines[0] and lines[0].startswith("localspec: ")
    again = _localspec("run", "-n", "4", "--temp", "0", "--no-spec", "hi")
    assert again.returncode == 0 and "fast paths" not in again.stderr  # read from the cache: said once
    shown = _localspec("models", "show", "smollm2-135m").stdout
    assert "cpu fast paths: none" in shown and "SIGILL" in shown  # models show says it every time


def test_no_repack_flag_skips_the_test_load(verdicts):
    r = _localspec("run", "-n", "2", "--temp", "0", "--no-spec", "--no-repack", "hi",
                   env=probe.env("all:SIGILL"))
    assert r.returncode == 0 and "fast paths" not in r.stderr
    assert not list(verdicts.glob("fastpath-*.json"))


def test_models_show_reports_fast_paths_and_system_info(verdicts, smollm2_path):
    mode = fastpath.choose(smollm2_path).mode  # "all", or less on a machine whose build crashes (AMX)
    r = _localspec("models", "show", "smollm2-135m", "--json")
    d = json.loads(r.stdout)
    assert d["fast_path"]["mode"] == mode and "CPU :" in d["system_info"]
    text = _localspec("models", "show", "smollm2-135m").stdout
    assert f"cpu fast paths: {mode}" in text and "system: CPU :" in text


def test_a_q4_0_copy_keeps_cpu_repack_by_override(verdicts, smollm2_path, tmp_path, monkeypatch):
    """Q4_0, the type CPU_REPACK speeds up most: with AMX's crash simulated, its 2-D weights go to CPU_REPACK
    by name and decode as llama.cpp's own placement does."""
    from localspec.models.gguf_tools import write_requantized

    q4_0 = write_requantized(smollm2_path, tmp_path / "smol-q4_0.gguf", "Q4_0")
    monkeypatch.setenv(FAULT_ENV, "all:SIGILL")
    plan = fastpath.choose(q4_0)
    assert plan.mode == "repack" and len(plan.repacked) == len(fastpath.repack_tensors(q4_0)) > 100
    monkeypatch.delenv(FAULT_ENV)
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", str(tmp_path / "real"))
    repack = _greedy(q4_0, "repack")
    if not fastpath.choose(q4_0).failures:  # mode all crashes for real on a Xeon with AMX
        assert repack == _greedy(q4_0, "all")
    else:
        assert repack[:-6] == _greedy(q4_0, "none")[:-6]  # other kernels: a late near-tie may differ
