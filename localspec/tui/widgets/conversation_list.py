"""Side panel: saved conversations, newest first; choosing one posts `ConversationList.Chosen`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from ..store import Conversation


def when(ts: float, now: float | None = None) -> str:
    now = now or time.time()
    return time.strftime("%H:%M" if now - ts < 86400 else "%b %d", time.localtime(ts))


class ConversationList(OptionList):
    DEFAULT_CSS = """
    ConversationList { width: 28; border: none; border-right: vkey $primary 30%; }
    """

    BINDINGS = [Binding("delete", "delete", "Delete chat")]

    @dataclass
    class Chosen(Message):
        conversation_id: int

    @dataclass
    class Deleted(Message):
        """The user asked to delete this saved conversation (the app owns the store)."""

        conversation_id: int

    def set_conversations(self, conversations: list[Conversation], *, current: int | None = None) -> None:
        self.clear_options()
        for c in conversations:
            label = Text.assemble((when(c.updated), "dim"), " ", c.title)
            self.add_option(Option(label, id=str(c.id)))
        if current is not None:
            try:
                self.highlighted = self.get_option_index(str(current))
            except Exception:  # not listed (deleted meanwhile): leave the highlight alone
                pass

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Chosen(int(event.option.id)))

    def action_delete(self) -> None:
        if self.highlighted is not None:
            option = self.get_option_at_index(self.highlighted)
            if option.id is not None:
                self.post_message(self.Deleted(int(option.id)))
