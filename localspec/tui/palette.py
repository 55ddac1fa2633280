"""Command palette entries (ctrl+p): one for each footer key, each speculation setting and each draft length.

Entries are data: (title, help, action), where action is an action string the app runs (`App.run_action`), so
this module knows the app only by its action names and reads nothing but the public `SpecControls`.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from .controls import AUTO, K_STEPS, OFF, ON, SpecControls

SETTING_HELP = {
    AUTO: "The adaptive controller picks γ each round and switches drafting off when it does not pay",
    ON: "Always draft (a fixed γ; ctrl+k changes it)",
    OFF: "Plain decoding, no drafts",
}


class Command(NamedTuple):
    title: str
    help: str
    action: str  # an action of the app, e.g. "spec('on')"


def chat_commands(controls: SpecControls | None) -> Iterator[Command]:
    yield Command("New chat", "Start a new conversation (ctrl+n)", "new_chat")
    yield Command("Regenerate", "Answer the last message again (ctrl+r)", "regenerate")
    yield Command("Switch model", "Load another model from the registry; the chat goes on (ctrl+o)", "pick_model")
    choices = controls.choices if controls is not None else ()
    for setting in choices:
        now = " (now)" if controls is not None and controls.setting == setting else ""
        yield Command(f"Speculation: {setting}{now}", SETTING_HELP[setting] + " (ctrl+s cycles)", f"spec('{setting}')")
    if ON in choices:
        yield Command("Change draft length", "Cycle k through " + ", ".join(map(str, K_STEPS))
                      + (", auto" if AUTO in choices else "") + " (ctrl+k)", "cycle_k")
        for k in K_STEPS:
            yield Command(f"Draft length k={k}", f"Speculation on, drafting {k} tokens per round", f"set_k({k})")
    yield Command("Toggle token colouring", "Colour text from accepted drafts (ctrl+t)", "toggle_colour")
    yield Command("Copy last answer", "Copy the last answer to the clipboard (ctrl+y)", "copy_last")
    yield Command("Stop generation", "Stop the answer after the current round (Esc)", "stop")
    yield Command("Toggle conversations", "Show or hide saved chats (ctrl+b)", "toggle_sidebar")
