"""The prompt line, with a shell-like history: ↑ and ↓ walk earlier prompts (seeded from saved chats)."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input


class PromptInput(Input):
    BINDINGS = [
        Binding("up", "history(-1)", "Earlier prompt", show=False),
        Binding("down", "history(1)", "Later prompt", show=False),
    ]

    def __init__(self, history: list[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history: list[str] = list(history or [])
        self._pos = len(self.history)  # == len(history): editing a new line
        self._draft = ""

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = len(self.history)
        self._draft = ""

    def action_history(self, delta: int) -> None:
        if not self.history:
            return
        if self._pos == len(self.history):
            self._draft = self.value
        self._pos = max(0, min(len(self.history), self._pos + delta))
        self.value = self._draft if self._pos == len(self.history) else self.history[self._pos]
        self.cursor_position = len(self.value)
