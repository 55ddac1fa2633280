"""The option blocks: one declaration each, one value each (EngineConfig, SamplingParams), the same names on every
command, full --help summaries, and usage errors as one line."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.commands.options import CHAT_SAMPLING, engine_options, metrics_options, sampling_options


def cli(*args: str, **kw):
    return CliRunner().invoke(main, list(args), terminal_width=200, **kw)


def _options(command: str) -> set[str]:
    cmd = main.get_command(click.Context(main), command)
    return {o for p in cmd.params for o in p.opts + p.secondary_opts}


@click.command()
@engine_options
def config_probe(engine_config):
    keys = ("model", "draft", "k", "hybrid", "adaptive", "n_ctx")
    click.echo(json.dumps({k: getattr(engine_config, k) for k in keys}))


@click.command()
@click.option("--chat", is_flag=True)
@sampling_options(chat_flag="chat")
@metrics_options
def sampling_probe(chat, params, metrics_log, task):
    click.echo(json.dumps({"params": params.__dict__, "log": metrics_log is not None, "task": task}))


def probe(cmd, *args):
    r = CliRunner().invoke(cmd, list(args))
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_help_summaries_are_whole_at_200_columns():
    for args in (["--help"], ["models", "--help"], ["models"]):
        r = cli(*args)
        assert r.exit_code == 0, r.output
        rows = r.output.split("Commands:")[1].strip().splitlines()
        assert not any(row.rstrip().endswith(("...", "…")) for row in rows), r.output
        assert all(not row.startswith("   ") for row in rows), r.output  # one line each, none wrapped


def test_every_model_command_takes_the_same_engine_options():
    run, chat, serve = (_options(c) for c in ("run", "chat", "serve"))
    engine = {"--model", "--pair", "--draft", "--lookup", "--no-spec", "-k", "--ctx", "--ngl", "--ngl-draft",
              "--threads", "--verbose", "--rpc", "--no-adaptive", "--k-min", "--k-max", "--hybrid"}
    assert engine <= run and engine <= chat and engine <= serve
    sampling = {"--temp", "--top-k", "--top-p", "--min-p", "--seed", "--repeat-penalty", "--repeat-last-n"}
    assert sampling <= run and sampling <= chat
    # serve reads sampling from each request and writes no acceptance log: it does not offer those options
    assert not (sampling | {"--metrics-log", "--task"}) & serve
    bench = _options("bench")
    assert {"-k", "--k", "--pair", "--model", "--draft", "--lookup", "--ctx", "--threads", "--temp", "--seed",
            "--repeat-penalty", "--repeat-last-n"} <= bench


def test_serve_help_does_not_advertise_options_it_ignores():
    out = cli("serve", "--help").output
    assert "--pair" in out and "--metrics-log" not in out and "--task" not in out and "--temp" not in out


def test_serve_refuses_to_sleep_a_single_model():
    """--sleep-idle-seconds works in router mode; a single-model server says so rather than never sleeping."""
    r = cli("serve", "--model", "smollm2-135m", "--port", "0", "--sleep-idle-seconds", "5")
    assert r.exit_code == 2 and "router mode only" in r.output


def test_pair_is_resolved_once_with_one_precedence():
    assert probe(config_probe, "--pair", "smollm2-135m-lookup")["model"] == "smollm2-135m"
    assert probe(config_probe, "--pair", "smollm2-135m-lookup")["draft"] == "lookup"
    assert probe(config_probe, "--pair", "smollm2-135m-lookup", "--no-spec")["draft"] == "none"
    assert probe(config_probe, "--pair", "qwen2.5-coder-7b")["draft"] == "qwen2.5-coder-0.5b-instruct"
    assert probe(config_probe, "--pair", "qwen2.5-coder-7b", "--lookup")["draft"] == "lookup"
    hybrid = probe(config_probe, "--pair", "qwen2.5-coder-7b", "--hybrid")
    assert hybrid["draft"] == "qwen2.5-coder-0.5b-instruct" and hybrid["hybrid"]
    # the pair does not pin γ: speculation stays adaptive unless -k is given
    assert probe(config_probe, "--pair", "qwen2.5-coder-7b")["k"] is None
    assert probe(config_probe, "--pair", "qwen2.5-coder-7b", "-k", "3")["k"] == 3


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench"])
def test_pair_errors_are_the_same_everywhere(command):
    r = cli(command, "--pair", "no-such-pair", *(["hi"] if command == "run" else []))
    assert r.exit_code == 2 and r.output.startswith("error: no pair named 'no-such-pair'"), r.output
    assert "smollm2-135m-lookup" in r.output and len(r.output.strip().splitlines()) == 1
    if command != "bench":
        r = cli(command, "--pair", "smollm2-135m-lookup", "--model", "x")
        assert r.exit_code == 2 and "choose one of --model and --pair" in r.output


def test_sampling_defaults_plain_greedy_chat_like_with_chat():
    plain = probe(sampling_probe)["params"]
    assert plain["temperature"] == 0 and plain["repeat_penalty"] == 1.0 and plain["repeat_last_n"] == 64
    chat = probe(sampling_probe, "--chat")["params"]
    assert {k: chat[k] for k in CHAT_SAMPLING} == CHAT_SAMPLING
    assert CHAT_SAMPLING == dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                                 repeat_last_n=64)
    mine = probe(sampling_probe, "--chat", "--temp", "0", "--repeat-penalty", "1.3", "--repeat-last-n", "8")
    assert mine["params"]["temperature"] == 0 and mine["params"]["repeat_penalty"] == 1.3
    assert mine["params"]["repeat_last_n"] == 8 and mine["params"]["top_k"] == 40
    logged = probe(sampling_probe, "--metrics-log", "x.jsonl", "--task", "t")
    assert logged["log"] and logged["task"] == "t"


def test_help_states_the_sampling_defaults():
    run, chat = cli("run", "--help").output, cli("chat", "--help").output
    assert "default 0; with --chat 0.8" in run and "default 1; with --chat 1.1" in run
    assert "default 0.8" in chat and "default 1.1" in chat and "default 64" in chat


def test_k_help_tells_the_truth_and_k0_points_to_no_spec():
    out = " ".join(cli("run", "--help").output.split())
    assert "Default: adaptive" in out and "Pin the draft length" in out and "For no drafting use --no-spec" in out
    for args in (["run", "-k", "0", "hi"], ["bench", "-k", "0"], ["bench", "-k", "2,0"]):
        r = cli(*args)
        assert r.exit_code == 2 and "use --no-spec for no drafting" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1


def test_usage_errors_are_one_line():
    r = cli("run", "--no-spec", "--lookup", "hi")
    assert r.exit_code == 2 and r.output.startswith("error: choose one of --draft, --lookup, --no-spec")
    assert len(r.output.strip().splitlines()) == 1 and "run --help" in r.output
    r = cli("nosuchcommand")
    assert r.exit_code == 2 and r.output.startswith("error: No such command")


def test_offload_options_reach_load_options():
    @click.command()
    @engine_options
    def load_probe(engine_config):
        click.echo(json.dumps({"ngl": engine_config.ngl, "ngl_draft": engine_config.ngl_draft, **{
            k: getattr(engine_config.load, k) for k in ("main_gpu", "tensor_split", "flash_attn", "type_k", "type_v",
                                               "rpc_servers", "mmap")}}))

    assert probe(load_probe, "--ngl", "-1", "--ngl-draft", "0", "--main-gpu", "1", "--tensor-split", "3,1",
                 "--flash-attn", "on", "--cache-type-k", "q8_0", "--cache-type-v", "q4_0",
                 "--rpc", "10.0.0.2:50052, 10.0.0.3:50052", "--no-mmap") == {
        "ngl": -1, "ngl_draft": 0, "main_gpu": 1, "tensor_split": [3.0, 1.0], "flash_attn": True, "type_k": 8,
        "type_v": 2, "rpc_servers": ["10.0.0.2:50052", "10.0.0.3:50052"], "mmap": False}
    d = probe(load_probe)
    assert d["flash_attn"] is None and d["type_k"] is None and d["rpc_servers"] == [] and d["tensor_split"] is None
    assert d["mmap"] is None and probe(load_probe, "--mmap")["mmap"] is True
    for bad in ("a,b", "0,0", "nan,1"):
        assert CliRunner().invoke(load_probe, ["--tensor-split", bad]).exit_code == 2


def test_readme_lists_every_exit_code():
    """Every exit code the program uses (LocalspecError subclasses, click usage errors, Ctrl-C, closed stdout)."""
    import importlib
    import pkgutil
    import re
    from pathlib import Path

    import localspec
    from localspec.commands.common import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
    from localspec.errors import LocalspecError

    for m in pkgutil.walk_packages(localspec.__path__, "localspec."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)

    def subclasses(c):
        return {c} | {s for sub in c.__subclasses__() for s in subclasses(sub)}

    codes = {c.exit_code for c in subclasses(LocalspecError)} | {0, 2, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE}
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    listed = {int(x) for x in re.findall(r"^\| `(\d+)` \|", readme, re.M)}
    assert codes <= listed, codes - listed


def test_mode_and_k_report_what_happened():
    """One rule for every front end (outcome.outcome): k is the γ chosen in most of THIS request's rounds,
    auto-off only when the controller chose γ = 0 in every round, plain when nothing was drafted."""
    from localspec.engine.outcome import outcome
    from localspec.speculative.types import ControllerState

    def st(k_chosen, off=None):
        return ControllerState(True, k_chosen, {}, (), {}, {}, {}, off)

    before = st({4: 100})
    o = outcome(before, st({4: 102, 8: 7, 0: 30}), draft_n=40, rounds=39)
    assert (o.mode, o.k, o.k_chosen) == ("spec", 8, {4: 2, 8: 7, 0: 30})  # not the configured γ, not history
    assert outcome(None, st({0: 9}, "it would be 20 % slower"), draft_n=0, rounds=9).mode == "auto-off"
    assert outcome(None, st({4: 1}), draft_n=0, rounds=1).mode == "plain"  # --no-adaptive -n 1: nothing drafted
    assert outcome(None, None, draft_n=0, rounds=5) == outcome(None, None, draft_n=0, rounds=1)

