"""Messages the worker threads post to the UI. Workers never touch widgets; the UI never calls the model.

The load worker posts to the app; a generation worker posts to the `Chat` that started it (they do not bubble).

Each generation carries an id so an update from a request the user already left (new chat, reload)
is recognised and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from .stream import Update

if TYPE_CHECKING:
    from ..engine.engine import Engine


@dataclass
class LoadProgress(Message):
    """A line from the loader (resolving names, fetching the embedded model, loading)."""

    text: str


@dataclass
class EngineReady(Message):
    engine: "Engine"


@dataclass
class EngineFailed(Message):
    """Loading failed with a user error (missing model, incompatible drafter): shown in the app."""

    error: str
    exit_code: int = 1  # the LocalspecError's, so `localspec chat` exits as `run` would


@dataclass
class Generated(Message, bubble=False):
    """A batch of new text and the running stats (at most ~20 per second)."""

    gen_id: int
    update: Update


@dataclass
class GenerationFailed(Message, bubble=False):
    """The request could not run (context full, no chat template): one line for the chat log."""

    gen_id: int
    error: str


@dataclass
class GenerationEnded(Message, bubble=False):
    """The worker is done with the engine (after the last Generated or GenerationFailed)."""

    gen_id: int
