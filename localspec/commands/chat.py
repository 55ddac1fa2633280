"""`localspec chat`: the Textual chat TUI. Parses options and starts the app; the app loads the models."""

from __future__ import annotations

import sys
from dataclasses import replace

import click

from .common import adaptive_settings, engine_options, engine_spec, friendly_errors


@click.command()
@engine_options
@click.option("--pair", metavar="NAME", help="A target+drafter pair from models.toml ([pairs.NAME]).")
@click.option("--system", metavar="TEXT", help="System message for new conversations.")
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=1024, show_default=True,
              help="Maximum new tokens per answer.")
@click.option("--temp", type=click.FloatRange(0), default=0.0, show_default=True, help="Temperature (0 = greedy).")
@click.option("--top-k", type=click.IntRange(0), default=0, help="Top-k (0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, help="Top-p (1 = off).")
@click.option("--min-p", type=click.FloatRange(0, 1), default=0.0, help="Min-p (0 = off).")
@click.option("--seed", type=int, help="Random seed for sampling.")
@friendly_errors
def chat(model, draft, lookup, no_spec, k, n_ctx, ngl, ngl_draft, threads, verbose, pair, system, max_tokens, temp,
         top_k, top_p, min_p, seed):
    """Chat in the terminal with live tokens/s and draft acceptance.

    \b
    Keys: ctrl+n new chat · ctrl+s speculation auto/on/off · ctrl+k change k · ctrl+t colour accepted drafts
          ctrl+y copy answer · Esc stop · ↑ history · ctrl+p commands · ctrl+q quit
    Conversations are saved in $LOCALSPEC_HOME/chats.sqlite.
    """
    from ..metrics import MetricsLog
    from ..sampling import SamplingParams
    from ..tui.app import ChatApp

    spec = engine_spec(model, draft, lookup, no_spec, k, n_ctx, ngl, ngl_draft, threads, verbose)
    if pair:
        spec = pair_spec(pair, spec, model_given=model is not None)
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    opts = adaptive_settings()
    mlog = MetricsLog(opts["metrics_log"]) if opts["metrics_log"] else None
    app = ChatApp(spec=spec, system=system, params=params, max_tokens=max_tokens, metrics_log=mlog,
                  task=opts["task"])
    app.run()
    if app.load_error:  # shown in the app; repeated here so scripts and the shell see it too
        click.echo(f"error: {app.load_error.error}", err=True)
        sys.exit(app.load_error.exit_code)


def pair_spec(name: str, spec, *, model_given: bool):
    """--pair NAME -> the pair's target, drafter and k (explicit --draft/--lookup/--no-spec/-k still win)."""
    from ..errors import ModelNotFound
    from ..registry import load_registry

    if model_given:
        raise click.UsageError("choose one of --model and --pair")
    pairs = load_registry().pairs
    p = pairs.get(name)
    if p is None:
        raise ModelNotFound(f"no pair named {name!r} in models.toml; known pairs: {', '.join(sorted(pairs)) or 'none'}")
    return replace(spec, model=p.target, draft=spec.draft or p.drafter, k=spec.k if spec.k is not None else p.k)
