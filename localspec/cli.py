"""`localspec` command line: a click group; each subcommand lives in localspec/commands/."""

from __future__ import annotations

import importlib

import click

from . import __version__

# name -> "module:function"; imported only when that command runs, so `--help` stays fast
COMMANDS = {
    "run": "localspec.commands.run:run",
    "chat": "localspec.commands.chat:chat",
    "serve": "localspec.commands.serve:serve",
    "bench": "localspec.commands.bench:bench",
    "models": "localspec.commands.models:models",
}


class LazyGroup(click.Group):
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """One full line per command (click's default cuts the summary at 45 characters)."""
        rows = [(name, cmd.get_short_help_str(limit=90)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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
