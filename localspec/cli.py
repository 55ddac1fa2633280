"""`localspec` command line: a click group; each subcommand lives in localspec/commands/."""

from __future__ import annotations

import importlib
import sys

import click

from . import __version__
from .commands.common import FullHelpGroup

# name -> "module:function"; imported only when that command runs, so `--help` stays fast
COMMANDS = {
    "run": "localspec.commands.run:run",
    "chat": "localspec.commands.chat:chat",
    "serve": "localspec.commands.serve:serve",
    "bench": "localspec.commands.bench:bench",
    "models": "localspec.commands.models:models",
}


_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class LazyGroup(FullHelpGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            if e.name == module:  # the command is not written yet
                return None
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode: bool = True, **extra):
        """Click's standalone mode, but a usage error is one line (`error: ...`) like every other error."""
        from .commands.common import error_line

        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS as e:  # `localspec` / `localspec models` alone: the help
            click.echo(e.ctx.get_help() if e.ctx else e.format_message())
            sys.exit(0)
        except click.UsageError as e:
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            error_line(f"{e.format_message()}{where}")
            sys.exit(e.exit_code)
        except click.ClickException as e:
            error_line(e.format_message())
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("interrupted", err=True)
            sys.exit(130)
        sys.exit(0)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="localspec")
def main() -> None:
    """localspec: fast local LLM generation with lossless speculative decoding.

    \b
    Quick start:
      localspec run "Write a haiku about the sea"      # embedded SmolLM2-135M, prompt lookup
      localspec chat                                   # terminal chat with live tok/s
      localspec serve                                  # llama.cpp/OpenAI/Ollama-compatible server
      localspec bench --quick                          # does speculation pay here?
    """


def entry() -> None:
    """The `localspec` console script: the command group in a watched child (supervise.py), so a crash inside
    llama.cpp ends with one line that names its likely cause."""
    from .commands.supervise import run_watched

    run_watched(main)
