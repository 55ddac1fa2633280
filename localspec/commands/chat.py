"""`localspec chat`: the Textual chat TUI. Parses options and starts the app; the app loads the models."""

from __future__ import annotations

import asyncio
import os
import sys

import click

from .common import friendly_errors
from .options import engine_options, metrics_options, sampling_options


@click.command()
@friendly_errors
@click.option("--system", metavar="TEXT", help="System message for new conversations.")
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=1024, show_default=True,
              help="Maximum new tokens per answer.")
@engine_options
@sampling_options(chat=True)
@metrics_options
def chat(system, max_tokens, engine_config, params, metrics_log, task):
    """Chat in the terminal with live tokens/s and draft acceptance.

    Samples like llama-server/Ollama by default (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty
    1.1 over the last 64 tokens); --temp 0 is greedy.

    \b
    Keys: ctrl+n new chat · ctrl+s speculation auto/on/off · ctrl+k change k · ctrl+t colour accepted drafts
          ctrl+y copy answer · ctrl+o switch model · Esc stop · ↑ history · ctrl+p commands · ctrl+q (ctrl+c twice) quit
    Conversations are saved in $LOCALSPEC_HOME/chats.sqlite.
    """
    from ..tui.app import ChatApp

    app = ChatApp(config=engine_config, system=system, params=params, max_tokens=max_tokens, metrics_log=metrics_log,
                  task=task)
    loop = asyncio.new_event_loop()  # not asyncio.run's: its end would wait for a model still loading
    app.run(loop=loop)
    if app.ending:  # a signal, a closed terminal or ctrl+c twice: the answer is saved, the engine closed
        _leave()
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    if app.load_error:  # shown in the app; repeated here so scripts and the shell see it too
        click.echo(f"error: {app.load_error.error}", err=True)
        sys.exit(app.load_error.exit_code)


def _leave() -> None:
    """Exit now: a model still loading in a worker thread would hold a normal exit until its load ends, and
    nothing of it is wanted."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the terminal is gone
            pass
    os._exit(0)
