"""The model picker (ctrl+o): every model the registry knows, which are on disk, and the drafter each loads with.

Picking one dismisses the screen with its name; the app unloads the current engine and loads that one, with the
same options. A model that is not on disk and would need the hub is not loadable from here: the screen says
which `localspec models pull` to run instead (the chat never downloads from the hub on its own).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from ...models.catalog import Known, human_size


def loadable(k: Known) -> bool:
    """On disk, or shipped by a PyPI package the loader may fetch; a hub model must be pulled first."""
    return k.present or (k.entry.source == "package" and k.problem is None)


def _where(k: Known) -> Text:
    if k.problem:
        return Text(f"damaged: {k.problem}", style="red")
    if k.present:
        return Text("on disk", style="green")
    if loadable(k):
        return Text("fetched on load (PyPI)", style="yellow")
    return Text(f"localspec models pull {k.name}", style="dim")


class ModelPicker(ModalScreen[str | None]):
    DEFAULT_CSS = """
    ModelPicker { align: center middle; }
    ModelPicker > Vertical { width: 90%; max-width: 130; height: auto; max-height: 80%;
                             border: round $primary; padding: 0 1; background: $surface; }
    ModelPicker #title { text-style: bold; width: 100%; }
    ModelPicker #hint { color: $text-muted; }
    ModelPicker DataTable { height: auto; max-height: 24; }
    """

    BINDINGS = [Binding("escape", "dismiss(None)", "Back")]

    def __init__(self, models: list[Known], current: str | None) -> None:
        super().__init__()
        self.models = {k.name: k for k in models}
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Switch model", id="title")
            yield DataTable(id="models", cursor_type="row", zebra_stripes=True)
            yield Label("Enter loads the model (the chat goes on with it) · Esc goes back", id="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "model", "where", "size", "quant", "drafter")
        for k in self.models.values():
            mark = "●" if k.name == self.current else ("*" if k.default else "")
            table.add_row(mark, Text(k.name, style="bold" if loadable(k) else "dim"), _where(k),
                          human_size(k.size_bytes), k.quant or "-", k.drafter, key=k.name)
        names = list(self.models)
        if self.current in self.models:
            table.move_cursor(row=names.index(self.current))
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        name = str(event.row_key.value)
        k = self.models[name]
        if not loadable(k):
            why = k.problem or f"{name} is not on disk: run 'localspec models pull {name}' first"
            self.notify(why, severity="warning")
            return
        self.dismiss(None if name == self.current else name)
