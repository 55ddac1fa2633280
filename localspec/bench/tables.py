"""The command line's tables, drawn by rich: colour and the terminal's width on a TTY, plain text in a pipe.

It imports only rich, so `localspec models` and the bench report draw the same tables (it sits in
bench/, the lowest front end, so commands/ can import it too). Cells are plain text, never rich markup: model
names, tokens and paths hold brackets.
"""

from __future__ import annotations

import io
import sys
from typing import Iterable

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# a pipe has no width: wide enough that no row wraps, since tests and grep read whole lines
PLAIN_WIDTH = 1000


def grid(*headers: str, right: Iterable[int] = ()) -> Table:
    """A table with a header and a rule under it, no frame; columns whose index is in `right` align right."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, highlight=False)
    right = set(right)
    for i, h in enumerate(headers):
        # a narrow terminal folds a long cell onto more lines rather than cutting it with an ellipsis
        t.add_column(h, justify="right" if i in right else "left", no_wrap=i == 0, overflow="fold")
    return t


def facts() -> Table:
    """Two columns without a header: 'name:' aligned right, then its value ('   arch: llama')."""
    t = Table.grid(padding=(0, 1))
    t.add_column(justify="right", no_wrap=True)
    t.add_column(overflow="fold")
    return t


def add(t: Table, *cells: object) -> None:
    """One row, every cell as plain text (str() of it; markup such as [b] stays literal)."""
    t.add_row(*(Text(str(c)) for c in cells))


def render(t: Table) -> str:
    """The table as plain text: no colour, no wrapping, no trailing spaces (pipes, files, reports, tests)."""
    buf = io.StringIO()
    Console(file=buf, width=PLAIN_WIDTH, color_system=None, force_terminal=False, highlight=False, markup=False,
            emoji=False).print(t)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def echo(t: Table, file=None) -> None:
    """Print to stdout (or `file`): rich's own rendering on a terminal, `render`'s plain text otherwise."""
    out = file or sys.stdout
    if out.isatty():
        Console(file=out, highlight=False, markup=False, emoji=False).print(t)
    else:
        print(render(t), file=out)
