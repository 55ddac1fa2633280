"""The one way commands show errors and their help (the option blocks they share are in options.py)."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable

import click

from ..errors import LocalspecError

_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE = 141  # stdout closed by the reader, e.g. `| head` (128 + SIGPIPE)


def friendly_errors(f: Callable) -> Callable:
    """LocalspecError -> one line on stderr and its exit code; Ctrl-C and a closed stdout -> their codes.
    No traceback for anything a user can cause."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except LocalspecError as e:
            error_line(str(e))
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # Python would print another error flushing stdout at exit: point stdout at /dev/null first
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # not a real file (click's test runner)
                pass
            sys.exit(EXIT_BROKEN_PIPE)

    return wrapper


def error_line(msg: str) -> None:
    """`error: msg` on stderr as ONE line: line breaks that came in with user input are shown escaped."""
    click.echo("error: " + msg.translate(_LINE_BREAKS), err=True)


def log_err(msg: str) -> None:
    click.echo(msg, err=True)


class FullHelpGroup(click.Group):
    """A group whose --help lists each command with its whole one-paragraph summary (click cuts it at 45
    characters with "..."); lines wrap at the terminal width instead."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, cmd.get_short_help_str(limit=10_000)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
