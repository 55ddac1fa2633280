"""`localspec run` as a user runs it: a real subprocess, real exit codes, one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", "run", *args], capture_output=True, text=True,
                          input=input, timeout=300)


def _one_line_error(r: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0]


def test_default_model_json(smollm2_path):
    r = _run("--json", "-n", "8", "--prompt", "The capital of France is")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "tokens", "mode", "k", "draft_n", "draft_n_accepted", "acceptance_rate",
                "mean_acceptance_length", "tokens_per_second", "ttft_ms"):
        assert key in out
    assert out["tokens"] == 8 and out["text"]


def test_streams_text_and_stats_line_from_stdin(smollm2_path):
    r = _run("--no-spec", "-n", "6", input="Hello, my name is")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "tok/s" in r.stderr


def test_incompatible_drafter_refused(smollm2_path, gemma_path):
    r = _run("--draft", str(gemma_path), "-n", "4", "hi")
    _one_line_error(r, 2, "cannot draft", "vocab")


def test_missing_model_path(tmp_path):
    _one_line_error(_run("--model", str(tmp_path / "nope.gguf"), "hi"), 2, "not found")


def test_text_file_named_gguf(tmp_path):
    f = tmp_path / "notes.gguf"
    f.write_text("this is not a model\n")
    _one_line_error(_run("--model", str(f), "hi"), 2, "not a GGUF")


def test_truncated_gguf(tmp_path, smollm2_path):
    f = tmp_path / "half.gguf"
    with open(smollm2_path, "rb") as src:
        f.write_bytes(src.read(20_000_000))
    _one_line_error(_run("--model", str(f), "hi"), 2, "truncated")


def test_prompt_longer_than_context(smollm2_path):
    _one_line_error(_run("--ctx", "256", "--prompt", "word " * 600), 2, "context")


@pytest.mark.parametrize("args", [["--no-spec", "--lookup"], ["--top-p", "0"]])
def test_bad_options_are_usage_errors(args):
    r = _run(*args, "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_chat_template_from_models_toml_overrides_the_gguf(tmp_path, gemma_path, monkeypatch):
    """Gemma-3-270M (base) ships no chat template: --chat fails with one line, until models.toml gives one."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text(
        f'[models.gemma-plain]\npath = "{gemma_path}"\n\n'
        f'[models.gemma-chat]\npath = "{gemma_path}"\n'
        'chat_template = "{% for m in messages %}<start_of_turn>{{ m.role }}\\n{{ m.content }}<end_of_turn>\\n'
        '{% endfor %}<start_of_turn>model\\n"\n')
    _one_line_error(_run("--model", "gemma-plain", "--chat", "--no-spec", "-n", "4", "hi"), 2, "no chat template")
    r = _run("--model", "gemma-chat", "--chat", "--no-spec", "-n", "4", "--json", "hi")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] >= 1


def test_labels_tell_what_happened_for_a_one_token_request(smollm2_path):
    """-n 1 leaves no room to draft: the request decoded plainly, and says "plain" (not "auto-off": the
    controller switched nothing off); a 1-token prompt has no prefill rate to report (its time is one decode step)."""
    r = _run("--json", "--no-adaptive", "-k", "3", "-n", "1", "--prompt", "Hi")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mode"] == "plain" and out["k"] == 0 and out["prompt_tokens"] == 1 and out["prompt_per_second"] == 0
    assert out["stats"]["prompt_per_second"] == 0
    r = _run("--no-spec", "-n", "2", "Hi")
    assert r.returncode == 0, r.stderr
    assert "prompt 1 tok (0 cached)" in r.stderr and not re.search(r"cached\) \d+ tok/s", r.stderr)


def test_chat_run_samples_with_chat_defaults_and_plain_run_is_greedy(smollm2_path):
    plain = [json.loads(_run("--json", "--no-spec", "-n", "12", "--prompt", "Once upon a time").stdout)["text"]
             for _ in range(2)]
    assert plain[0] == plain[1]  # greedy: the same text every time
    r = _run("--json", "--chat", "--no-spec", "-n", "4", "--seed", "1", "--prompt", "Hi")
    assert r.returncode == 0 and json.loads(r.stdout)["tokens"] >= 1, r.stderr


def test_closed_stdout_is_exit_141_without_a_traceback(smollm2_path):
    """`localspec run ... | head -c 5`: the reader goes away mid-stream."""
    p = subprocess.Popen([sys.executable, "-m", "localspec", "run", "--no-spec", "-n", "64", "Once upon a time"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(5)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and "Traceback" not in err, err
