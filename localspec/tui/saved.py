"""Rebuild a saved conversation: stored messages -> chat history and widgets, each answer with its stats."""

from __future__ import annotations

from textual.widget import Widget

from .store import ChatStore, StoredMessage
from .stream import from_spans
from .summary import meta_line
from .widgets.chat_message import AssistantMessage, UserMessage


def saved_widgets(store: ChatStore, conversation_id: int, *,
                  coloured: bool) -> tuple[list[Widget], list[dict[str, str]], StoredMessage | None]:
    """(widgets, history for the engine, last assistant message or None), in conversation order."""
    widgets: list[Widget] = []
    history: list[dict[str, str]] = []
    last: StoredMessage | None = None
    for m in store.messages(conversation_id):
        history.append({"role": m.role, "content": m.content})
        if m.role == "user":
            widgets.append(UserMessage(m.content))
        else:
            spans = (m.stats or {}).get("accepted_spans", [])
            widgets.append(AssistantMessage(m.content, meta=meta_line(m.stats or {}), coloured=coloured,
                                            segments=from_spans(m.content, spans)))
            last = m
    return widgets, history, last
