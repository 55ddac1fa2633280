"""Options every model-using command shares (run, chat, serve, bench) and the one way errors are shown."""

from __future__ import annotations

import functools
import sys
from typing import Callable

import click

from ..errors import LocalspecError


def engine_options(f: Callable) -> Callable:
    """--model/--draft/--lookup/--no-spec/-k/--ctx/--ngl/--ngl-draft/--threads/--verbose."""
    opts = [
        click.option("--model", "-m", metavar="NAME|PATH", help="Target model: a models.toml name or a .gguf path "
                     "(default: the embedded SmolLM2-135M)."),
        click.option("--draft", metavar="NAME|PATH", help="Drafter model with the same tokenizer."),
        click.option("--lookup", is_flag=True, help="Draft by prompt lookup (n-grams from the context)."),
        click.option("--no-spec", is_flag=True, help="Plain decoding, no speculation."),
        click.option("-k", "k", type=click.IntRange(1, 64), help="Draft length (default: the pair's, else 4)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(16), help="Context length in tokens."),
        click.option("--ngl", type=int, default=0, show_default=True,
                     help="Target layers to offload to the GPU (-1 = all)."),
        click.option("--ngl-draft", type=int, help="Drafter layers to offload (default: same as --ngl)."),
        click.option("--threads", "-t", type=click.IntRange(1), help="CPU threads (default: all cores)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's load log (offload, buffers)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def engine_spec(model, draft, lookup, no_spec, k, n_ctx, ngl, ngl_draft, threads, verbose):
    from ..loader import LOOKUP, NONE, EngineSpec

    chosen = [x for x in (draft, lookup, no_spec) if x]
    if len(chosen) > 1:
        raise click.UsageError("choose one of --draft, --lookup, --no-spec")
    d = draft or (LOOKUP if lookup else NONE if no_spec else None)
    return EngineSpec(model=model, draft=d, k=k, n_ctx=n_ctx, threads=threads, ngl=ngl, ngl_draft=ngl_draft,
                      verbose=verbose)


def friendly_errors(f: Callable) -> Callable:
    """LocalspecError -> one line on stderr and its exit code; no traceback."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except LocalspecError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def log_err(msg: str) -> None:
    click.echo(msg, err=True)
