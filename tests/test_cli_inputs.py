"""Bad input never reaches a traceback: a table of cases through the real `localspec` console script, and a
property test (hypothesis) over run's options and prompt sources in-process.

Every refused input exits with its documented code (2 bad input, 3 hub/network) and prints one line that starts
with "error:"; none of these cases loads a model (the --ctx case reads only the GGUF header).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.cli import main

pytestmark = pytest.mark.slow

# (arguments, stdin, exit code, words the one error line contains); "{empty}" / "{dir}" are filled in per run
CASES = [
    (["run", ""], None, 2, "the prompt is empty"),
    (["run", "--prompt", ""], None, 2, "the prompt is empty"),
    (["run", "--prompt-file", "{empty}"], None, 2, "is empty"),
    (["run"], "", 2, "stdin is empty"),
    (["run", "--prompt-file", "-"], "", 2, "stdin is empty"),
    (["run", "--prompt-file", "{dir}/missing.txt"], None, 2, "cannot read"),
    (["run", "--prompt-file", "{dir}"], None, 2, "is a directory"),
    (["run", "--prompt", "a", "b"], None, 2, "give the prompt once"),
    (["run", "hi", "extra"], None, 2, "unexpected extra argument"),
    (["run", "--nosuch", "hi"], None, 2, "No such option"),
    (["run", "-k", "0", "hi"], None, 2, "use --no-spec for no drafting"),
    (["run", "-k", "65", "hi"], None, 2, "-k"),
    (["run", "-n", "0", "hi"], None, 2, "--max-tokens"),
    (["run", "--temp", "nan", "hi"], None, 2, "not a finite number"),
    (["run", "--temp", "-1", "hi"], None, 2, "--temp"),
    (["run", "--top-p", "0", "hi"], None, 2, "--top-p"),
    (["run", "--top-p", "inf", "hi"], None, 2, "--top-p"),
    (["run", "--repeat-penalty", "0", "hi"], None, 2, "--repeat-penalty"),
    (["run", "--repeat-last-n", "-2", "hi"], None, 2, "--repeat-last-n"),
    (["run", "--seed", "-1", "hi"], None, 2, "--seed"),
    (["run", "--ctx", "8", "hi"], None, 2, "--ctx"),
    (["run", "--ctx", "100000", "hi"], None, 2, "trained context of smollm2-135m (8192 tokens"),
    (["run", "--threads", "0", "hi"], None, 2, "--threads"),
    (["run", "--no-spec", "--lookup", "hi"], None, 2, "choose one of --draft, --lookup, --no-spec"),
    (["run", "--hybrid", "hi"], None, 2, "--hybrid needs a drafter model"),
    (["run", "--k-min", "5", "--k-max", "2", "hi"], None, 2, "--k-min 5 is above --k-max 2"),
    (["run", "--system", "be brief", "hi"], None, 2, "--system needs --chat"),
    (["run", "--stop", "", "hi"], None, 2, "stop string cannot be empty"),
    (["run", "--tensor-split", "a,b", "hi"], None, 2, "comma-separated numbers"),
    (["run", "--model", "no-such-model", "hi"], None, 2, "unknown model"),
    (["run", "--model", "{dir}", "hi"], None, 2, "not a file"),
    (["run", "--model", "{dir}/none.gguf", "hi"], None, 2, "not found"),
    (["run", "--pair", "no-such-pair", "hi"], None, 2, "no pair named"),
    (["run", "--metrics-log", "{empty}/log.jsonl", "hi"], None, 2, "cannot write"),
    (["run", "--pair", "smollm2-135m-lookup", "--model", "x", "hi"], None, 2, "choose one of --model and --pair"),
    (["chat", "-k", "0"], None, 2, "use --no-spec"),
    (["serve", "--port", "70000"], None, 2, "--port"),
    (["serve", "--pair", "no-such-pair"], None, 2, "no pair named"),
    (["bench", "-k", "0"], None, 2, "use --no-spec for no drafting"),
    (["bench", "-k", "two"], None, 2, "not a draft length"),
    (["bench", "--temp", "nan"], None, 2, "finite"),
    (["bench", "--pair", "a="], None, 2, "not NAME or TARGET=DRAFTER"),
    (["bench", "--tasks", "nosuch"], None, 2, "unknown task"),
    (["bench", "--prompts", "{dir}/none.jsonl"], None, 2, "prompts file not found"),
    (["models", "pull", "no-such-model"], None, 2, "unknown model or pair"),
    (["models", "pull", "owner/repo"], None, 3, "cannot reach"),
    (["models", "show", "{dir}/none.gguf"], None, 2, "not found"),
    (["models", "check", "a", "b"], None, 2, "unknown model"),
    (["models", "rm", "no-such-model"], None, 2, "unknown model"),
    (["nosuchcommand"], None, 2, "No such command"),
]


def console_script() -> list[str]:
    """The installed `localspec` entry point (PYTHONPATH makes it run this tree), else `python -m localspec`."""
    exe = shutil.which("localspec")
    return [exe] if exe else [sys.executable, "-m", "localspec"]


def run_case(args: list[str], stdin: str | None, tmp: Path) -> subprocess.CompletedProcess:
    empty = tmp / "empty.txt"
    empty.write_text("")
    argv = [a.replace("{empty}", str(empty)).replace("{dir}", str(tmp)) for a in args]
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "LOCALSPEC_HOME": str(tmp / "home")}
    return subprocess.run(console_script() + argv, input=stdin or "", capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.parametrize("args,stdin,code,needle", CASES, ids=[" ".join(c[0]) or "run-empty" for c in CASES])
def test_bad_input_is_one_line_and_its_exit_code(args, stdin, code, needle, tmp_path, smollm2_path):
    r = run_case(args, stdin, tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert r.stdout == ""


class Loaded(Exception):
    """Raised instead of loading a model: the input got past every check."""


OPTION_VALUES = {
    "-k": st.sampled_from(["0", "1", "4", "64", "65", "-1", "x", ""]),
    "--temp": st.sampled_from(["0", "0.8", "-1", "nan", "inf", "1e309", "x"]),
    "--top-k": st.sampled_from(["0", "40", "-1", "x"]),
    "--top-p": st.sampled_from(["0", "0.9", "1", "1.5", "nan"]),
    "--min-p": st.sampled_from(["0", "0.05", "2", "-0"]),
    "--repeat-penalty": st.sampled_from(["0", "1", "1.1", "-1", "inf"]),
    "--repeat-last-n": st.sampled_from(["0", "64", "-1", "-2"]),
    "--seed": st.sampled_from(["0", "-1", "1" * 30, "x"]),
    "-n": st.sampled_from(["0", "1", "-5", "x"]),
    "--ctx": st.sampled_from(["0", "16", "100000", "x"]),
    "--k-min": st.sampled_from(["1", "9", "0"]),
    "--k-max": st.sampled_from(["1", "8", "99"]),
    "--threads": st.sampled_from(["0", "1", "4096"]),
    "--tensor-split": st.sampled_from(["3,1", "a", "0,0", ",", "nan"]),
    "--draft-p-min": st.sampled_from(["0", "0.5", "2", "nan"]),
    "--stop": st.sampled_from(["", "\n", "x"]),
    "--system": st.text(max_size=5),
    "--pair": st.sampled_from(["smollm2-135m-lookup", "nope", ""]),
    "--model": st.sampled_from(["", "x", "/", "a/b", "a.gguf"]),
    "--prompt": st.text(max_size=5),
}
FLAGS = ["--chat", "--json", "--lookup", "--no-spec", "--hybrid", "--no-adaptive", "--verbose"]
HELP = ("-h", "--help")


@st.composite
def run_argv(draw):
    argv: list[str] = []
    for name in draw(st.lists(st.sampled_from(sorted(OPTION_VALUES)), max_size=4)):
        argv += [name, draw(OPTION_VALUES[name])]
    argv += draw(st.lists(st.sampled_from(FLAGS), max_size=2, unique=True))
    # positional prompt(s), any unicode incl. surrogates; not the help flag, which answers with usage and exit 0
    argv += draw(st.lists(st.text(max_size=6).filter(lambda t: t not in HELP), max_size=2))
    return argv


@settings(max_examples=int(os.environ.get("LOCALSPEC_FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=run_argv(), stdin=st.binary(max_size=8))
def test_no_option_or_prompt_source_reaches_a_traceback(argv, stdin, monkeypatch):
    import localspec.engine.loader

    def refuse_to_load(*a, **k):
        raise Loaded()

    monkeypatch.setattr(localspec.engine.loader, "load_engine", refuse_to_load)
    r = CliRunner().invoke(main, ["run", *argv], input=stdin)
    if isinstance(r.exception, Loaded):
        return  # valid input: it reached the loader
    assert isinstance(r.exception, SystemExit), (argv, r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, r.output)


def test_prompt_bytes_that_are_not_utf8_are_replaced_not_fatal():
    from localspec.commands.run import read_prompt

    assert read_prompt("caf\udce9", None, None) == "caf\ufffd"  # argv byte 0xe9 (surrogateescape)
    assert read_prompt("\ud800x", None, None) == "?x"  # a lone surrogate from elsewhere
