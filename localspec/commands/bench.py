"""`localspec bench`: does speculation pay, for these models, on this machine, for this work?

Parses options and delegates to localspec.bench (runner, summary, report, plot). Prints the table and the
verdict; writes JSON / Markdown / PNG on request. `--from-log` summarises the acceptance log of real sessions.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import TypedDict

import click

from .common import EXIT_INTERRUPTED, friendly_errors, log_err
from .options import NO_DRAFT_HINT, Finite, pair_models


class Defaults(TypedDict):
    """What --quick and a full run use for the options the user left out."""

    per_task: int | None
    ks: str
    max_tokens: int
    temps: str
    repeats: int


QUICK = Defaults(per_task=1, ks="2,4,auto", max_tokens=64, temps="0", repeats=1)
FULL = Defaults(per_task=None, ks="2,4,6,auto", max_tokens=128, temps="0", repeats=1)


def parse_ks(text: str) -> tuple[tuple[int, ...], bool]:
    ks, auto = [], False
    for part in text.split(","):
        part = part.strip().lower()
        if part == "auto":
            auto = True
        elif part == "0":
            raise click.BadParameter(f"0 drafts nothing: {NO_DRAFT_HINT} (plain decoding is always measured)",
                                     param_hint="-k")
        elif part.isdigit() and 1 <= int(part) <= 32:
            ks.append(int(part))
        elif part:
            raise click.BadParameter(f"'{part}' is not a draft length 1..32 or 'auto'", param_hint="-k")
    if not ks and not auto:
        raise click.BadParameter("give at least one k", param_hint="-k")
    return tuple(sorted(set(ks))), auto


def parse_floats(text: str, hint: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"'{text}' is not a comma-separated list of numbers", param_hint=hint) from None
    if not vals or any(not math.isfinite(v) or v < 0 for v in vals):
        raise click.BadParameter("need one or more finite values >= 0", param_hint=hint)
    return vals


@click.command()
@click.option("--model", "-m", "models", multiple=True, metavar="NAME|PATH",
              help="Target model (repeatable; default: the embedded SmolLM2-135M).")
@click.option("--draft", "drafts", multiple=True, metavar="NAME|PATH|auto|self|mtp",
              help="Model drafter (repeatable); used for every target whose tokenizer it shares. 'auto': each "
              "target's fastest predicted local drafter (as run --draft auto); 'self': its low-bit copy "
              "('localspec models make-drafter'); 'mtp': the target file's own MTP heads (rows labelled mtp).")
@click.option("--models-dir", "models_dirs", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="A folder of GGUFs --draft auto also searches (repeatable).")
@click.option("--pair", "pairs", multiple=True, metavar="NAME|TARGET=DRAFTER",
              help="A models.toml pair, or an explicit target/drafter pair (repeatable).")
@click.option("--lookup", is_flag=True, help="Bench prompt lookup (the default when no --draft/--pair is given).")
@click.option("--all-drafters", is_flag=True, help="Prompt lookup, every given or registry-paired drafter, and a "
              "target's own MTP heads.")
@click.option("-k", "--k", "ks", metavar="LIST", help="Draft lengths, e.g. 1,2,4,6,8, and/or 'auto' (the adaptive "
              "controller; default 2,4,6,auto, --quick 2,4,auto). No drafting (plain) is always measured.")
@click.option("--tasks", metavar="LIST", help="Tasks to run: code,edit,chat,rag,json,prose (default: all), and "
              "tools,json-schema (prompts with a grammar; only when named).")
@click.option("--per-task", type=click.IntRange(1), help="Prompts per task (default: all; --quick: 1).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), help="Your own prompts (JSONL with "
              "\"task\" and \"prompt\"; \"chat\": false for raw completion).")
@click.option("--temp", "temps", metavar="LIST", help="Temperatures, e.g. 0,0.8 (default 0).")
@click.option("--repeat-penalty", type=Finite(0, min_open=True), default=1.0, show_default=True,
              help="Repeat penalty for every configuration, 1 = off.")
@click.option("--repeat-last-n", type=click.IntRange(-1), default=64, show_default=True,
              help="Tokens the repeat penalty looks back over (0 = off, -1 = all).")
@click.option("--repeats", type=click.IntRange(1), help="Runs per prompt and configuration (default 1).")
@click.option("--max-tokens", "-n", type=click.IntRange(1), help="New tokens per run (default 128; --quick 64).")
@click.option("--quick", is_flag=True, help="A small run (1 prompt per task, k=2,4,auto, 64 tokens): a few "
              "minutes on a 2-core CPU with the default model.")
@click.option("--ctx", "n_ctx", type=click.IntRange(256), default=2048, show_default=True, help="Context length.")
@click.option("--threads", "-t", type=click.IntRange(1), help="CPU threads (default: all cores).")
@click.option("--repack/--no-repack", "repack", default=None, help="llama.cpp's extra CPU buffer types (AMX, "
              "repacked weights) on or off (default: the fastest that passes its trial here).")
@click.option("--seed", type=click.IntRange(0), default=1234, show_default=True, help="Sampling seed (T > 0).")
@click.option("--busy", type=click.IntRange(0), default=0, metavar="N",
              help="Run N CPU-bound background processes during the bench (always stopped; noted in the report).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write the full results as JSON.")
@click.option("--markdown", "md_file", type=click.Path(dir_okay=False), help="Write a Markdown report.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), help="Write a PNG plot.")
@click.option("--note", metavar="TEXT", help="A paragraph for the Markdown report (e.g. how busy the machine was).")
@click.option("--from-log", "log_file", type=click.Path(dir_okay=False),
              help="Summarise acceptance from a metrics log (JSONL of real sessions) instead of running.")
@friendly_errors
def bench(models, drafts, models_dirs, pairs, lookup, all_drafters, ks, tasks, per_task, prompts_file, temps,
          repeat_penalty, repeat_last_n, repeats, max_tokens, quick, n_ctx, threads, repack, seed, busy, json_file,
          md_file, plot_file, note, log_file):
    """Measure plain vs speculative decoding on built-in tasks (or yours) and say whether speculation pays.

    \b
    Examples:
      localspec bench --quick
      localspec bench --model big.gguf --draft small.gguf --k 1,2,4,6,8 --temp 0,0.8
      localspec bench --prompts my_traffic.jsonl --lookup --json out.json --plot out.png
    """
    if log_file:
        return _from_log(log_file, json_file)
    from ..bench.busy import busy as busy_machine
    from ..bench.report import Report
    from ..bench.runner import Interrupted, Plan, count_runs, run_bench
    from ..bench.tasks import builtin_prompts, load_prompts, select

    d = QUICK if quick else FULL
    k_list, auto = parse_ks(ks or d["ks"])
    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    source = load_prompts(prompts_file) if prompts_file else builtin_prompts()
    prompts = select(source, task_list, per_task if per_task is not None else d["per_task"])
    targets = bench_targets(models, drafts, pairs, lookup, all_drafters, models_dirs)
    plan = Plan(targets=tuple(targets), prompts=tuple(prompts), ks=k_list, auto=auto,
                temps=parse_floats(temps or d["temps"], "--temp"), repeats=repeats or d["repeats"],
                max_tokens=max_tokens or d["max_tokens"], n_ctx=n_ctx, threads=threads, seed=seed, busy=busy,
                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                fast_path={True: "all", False: "none"}.get(repack))
    total = count_runs(plan)
    partial = False
    with busy_machine(busy), click.progressbar(length=total, label="bench", file=sys.stderr, show_pos=True,
                                               item_show_func=lambda s: s) as bar:
        try:
            results = run_bench(plan, progress=_progress(bar, total), log=log_err)
        except Interrupted as e:
            results, partial = e.results, True
    if partial and not results:
        log_err("bench: interrupted before any run finished; no report")
        sys.exit(EXIT_INTERRUPTED)
    command = _command_line()
    rep = Report.build(plan, results, command, partial=partial)
    if partial:
        log_err(f"bench: interrupted; partial report of the {rep.n_runs} finished runs of {total}")
    _write(rep, json_file, md_file, plot_file, note)
    if partial:
        sys.exit(EXIT_INTERRUPTED)


def _command_line() -> str:
    """The command as typed, for the report; the home directory is written ~ so reports carry no user paths."""
    if Path(sys.argv[0]).name != "localspec":
        return "localspec bench (API)"
    home = str(Path.home())
    args = [("~/" + shlex.quote(a[len(home) + 1:])) if a.startswith(home + "/") else shlex.quote(a)
            for a in sys.argv[1:] if a != "bench"]
    return "localspec bench " + " ".join(args)


def _write(rep, json_file: str | None, md_file: str | None, plot_file: str | None, note: str | None) -> None:
    """The table and verdict on stdout; the JSON / PNG / Markdown files asked for."""
    from ..bench.report import text_table, write_json, write_markdown

    click.echo(text_table(rep))
    click.echo(("verdict (partial): " if rep.partial else "verdict: ") + rep.verdict)
    if json_file:
        write_json(rep, json_file)
    if plot_file:
        from ..bench.plot import write_png

        write_png(rep.rows, plot_file)
    if md_file:
        write_markdown(rep, md_file, plot_file, note)


def _progress(bar, total: int):
    """Update the bar; when stderr is not a terminal (no bar drawn), log a line every ~10 % instead."""
    done = [0]
    tty = sys.stderr.isatty()

    def step(label: str) -> None:
        done[0] += 1
        bar.update(1, label)
        if not tty and (done[0] == 1 or done[0] % max(1, total // 10) == 0):
            log_err(f"bench: run {done[0]}/{total}: {label}")

    return step


def _auto_drafters(specs: dict[str, dict], kind: str, dirs: tuple[str, ...]) -> None:
    """--draft auto|self: each target's own drafter, chosen and said as `run` does (drafter_choice.auto_drafter); auto
    finding none gives that target a prompt-lookup row instead."""
    from ..engine.drafter_choice import SELF, auto_drafter
    from ..models import LOOKUP
    from ..models.resolve import resolve_model

    for name, s in specs.items():
        chosen = auto_drafter(s["path"], name, self_only=kind == SELF, dirs=dirs, log=log_err)
        if chosen == LOOKUP:
            s["lookup"] = True
            continue
        drf = resolve_model(chosen, log=log_err)
        s["drafters"][drf.name] = drf.path


def _shared_drafter(specs: dict[str, dict], drf) -> None:
    """A --draft model given once: added to every target whose tokenizer it shares (refused if none)."""
    from ..engine.loader import pair_problems

    used = False
    for name, s in specs.items():
        if drf.path == s["path"]:
            continue
        reasons = pair_problems(s["path"], drf.path)
        if reasons:
            log_err(f"bench: {drf.name} cannot draft for {name} ({reasons[0]}); skipped for that target")
            continue
        s["drafters"][drf.name] = drf.path
        used = True
    if not used:
        raise click.BadParameter(f"{drf.name} shares no target's tokenizer", param_hint="--draft")


def bench_targets(models, drafts, pairs, lookup: bool = False, all_drafters: bool = False,
                  models_dirs: tuple[str, ...] = ()):
    """The bench's TargetSpecs from its options: each target with the drafters it can use (--draft auto|self
    resolved per target, as run resolves them), no model loaded."""
    from ..bench.runner import TargetSpec
    from ..engine.drafter_choice import AUTO, SELF
    from ..models.registry import load_registry
    from ..models.resolve import resolve_model
    from ..speculative.mtp import MTP

    quiet = log_err
    want_lookup = lookup or all_drafters or not (drafts or pairs)
    specs: dict[str, dict] = {}

    def target(ref) -> dict:
        return specs.setdefault(ref.name, {"path": ref.path, "drafters": {}})

    for name in models or ([] if pairs else [None]):
        target(resolve_model(name, log=quiet))
    for pair in pairs:
        t, sep, dr = pair.partition("=")
        if not sep:  # a models.toml pair name
            p = pair_models(pair)
            t, dr = p.target, (None if p.drafter == "lookup" else p.drafter)
            want_lookup = want_lookup or dr is None
        elif not t or not dr:
            raise click.BadParameter(f"'{pair}' is not NAME or TARGET=DRAFTER", param_hint="--pair")
        tr = resolve_model(t, log=quiet)
        if dr:  # compatibility is checked when the runner loads the pair
            drf = resolve_model(dr, log=quiet)
            target(tr)["drafters"][drf.name] = drf.path
        else:
            target(tr)
    for kind in dict.fromkeys(d for d in drafts if d in (AUTO, SELF)):
        _auto_drafters(specs, kind, tuple(models_dirs))
    if MTP in drafts or all_drafters:
        _own_heads(specs, required=MTP in drafts)
    extra = [d for d in drafts if d not in (AUTO, SELF, MTP)]
    if all_drafters:
        reg = load_registry()
        extra += [p.drafter for n in specs for p in [reg.pair_for(n)] if p and p.drafter not in ("lookup", "none")]
    for dr in extra:
        _shared_drafter(specs, resolve_model(dr, log=quiet))
    return [TargetSpec(name, s["path"], tuple(s["drafters"].items()), want_lookup or s.get("lookup", False),
                       mtp=s.get("mtp", False)) for name, s in specs.items()]


def _own_heads(specs: dict[str, dict], *, required: bool) -> None:
    """--draft mtp (or --all-drafters): rows for each target file's own MTP heads, where it has them; --draft mtp
    is refused when no target has any."""
    from ..models.nextn import nextn_heads

    for name, s in specs.items():
        s["mtp"] = nextn_heads(s["path"]) > 0
        if required and not s["mtp"]:
            log_err(f"bench: {name} carries no MTP heads; no mtp rows for it")
    if required and not any(s["mtp"] for s in specs.values()):
        raise click.BadParameter("no target carries MTP heads to draft with", param_hint="--draft mtp")


def _from_log(path: str, json_file: str | None) -> None:
    from ..bench.fromlog import log_table, read_log

    rows, skipped = read_log(path)
    click.echo(log_table(rows, skipped))
    if json_file:
        Path(json_file).write_text(json.dumps({"schema": "localspec.bench-log/1", "skipped": skipped,
                                               "rows": [r.to_dict() for r in rows]}, indent=1) + "\n")
