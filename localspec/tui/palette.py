"""Command palette entries (ctrl+p): one for each footer key, plus a direct pick of the draft length."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from textual.app import SystemCommand

from .summary import AUTO, K_STEPS

if TYPE_CHECKING:
    from .app import ChatApp


def chat_commands(app: "ChatApp") -> Iterator[SystemCommand]:
    yield SystemCommand("New chat", "Start a new conversation (ctrl+n)", app.action_new_chat)
    yield SystemCommand("Toggle speculation", "Speculative decoding on/off, no reload (ctrl+s)",
                        app.action_toggle_spec)
    yield SystemCommand("Change draft length", "Cycle k through " + ", ".join(map(str, K_STEPS))
                        + (", auto" if app._adaptive else "") + " (ctrl+k)", app.action_cycle_k)
    if app._adaptive is not None:
        yield SystemCommand("Draft length auto", "The adaptive controller picks γ each round",
                            lambda: app.action_set_k(AUTO))
    for k in K_STEPS:
        yield SystemCommand(f"Draft length k={k}", f"Draft {k} tokens per round", lambda k=k: app.action_set_k(k))
    yield SystemCommand("Toggle token colouring", "Colour text from accepted drafts (ctrl+t)",
                        app.action_toggle_colour)
    yield SystemCommand("Copy last answer", "Copy the last answer to the clipboard (ctrl+y)", app.action_copy_last)
    yield SystemCommand("Stop generation", "Stop the answer after the current round (Esc)", app.action_stop)
    yield SystemCommand("Toggle conversations", "Show or hide saved chats (ctrl+b)", app.action_toggle_sidebar)
