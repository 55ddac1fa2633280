"""Shown while the models load (in a thread worker), so the terminal never looks frozen.

A load error (missing model, incompatible drafter) replaces the spinner with the one-line message and
what to do; no traceback. After a model switch, Esc on a failed load goes back to the model picker.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Label, LoadingIndicator, Log


class LoadingScreen(Screen):
    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen > Vertical { width: 80%; max-width: 100; height: auto; border: round $primary; padding: 1 2; }
    LoadingScreen #title { text-style: bold; width: 100%; content-align: center middle; }
    LoadingScreen LoadingIndicator { height: 3; }
    LoadingScreen Log { height: 8; border: none; background: $surface; }
    LoadingScreen #error { color: $error; text-style: bold; display: none; width: 100%; }
    LoadingScreen #hint { color: $text-muted; display: none; }
    LoadingScreen.-failed #error, LoadingScreen.-failed #hint { display: block; }
    LoadingScreen.-failed LoadingIndicator { display: none; }
    """

    BINDINGS = [Binding("q", "app.quit", "Quit"), Binding("escape", "back", "Back")]

    def __init__(self, what: str, *, back: str | None = None) -> None:
        """`back`: the app action Esc runs after a failed load (None: Esc quits, as at start-up)."""
        super().__init__()
        self.what = what
        self.back = back
        self.failed: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(f"Loading {self.what}"), id="title")
            yield LoadingIndicator()
            yield Log(id="progress")
            yield Label("", id="error", markup=False)
            hint = "Esc: pick another model · q: quit" if self.back else (
                "Press q to quit, fix the option, and start again.")
            yield Label(hint, id="hint")

    def progress(self, line: str) -> None:
        self.query_one("#progress", Log).write_line(line)

    async def action_back(self) -> None:
        if self.back is None or self.failed is None:
            self.app.exit()
            return
        self.app.pop_screen()
        await self.app.run_action(self.back)

    def fail(self, error: str) -> None:
        self.failed = error
        self.query_one("#error", Label).update(f"error: {error}")
        self.query_one("#title", Label).update(Text(f"Could not load {self.what}"))
        self.add_class("-failed")
