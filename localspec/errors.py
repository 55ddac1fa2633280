"""User-facing errors: each carries one line saying what is wrong and what to do.

Front ends print `str(err)` (CLI, exit code `err.exit_code`) or turn it into a 4xx body (server);
they never show a traceback for these.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base for errors caused by input, not by a bug."""

    exit_code = 1


class ModelLoadError(LocalspecError):
    """The file is missing, not a GGUF, truncated, or llama.cpp refused it."""

    exit_code = 2


class IncompatibleDrafter(LocalspecError):
    """The drafter does not share the target's tokenizer (llama.cpp's compatibility rule)."""

    exit_code = 2


class ContextOverflow(LocalspecError):
    """The prompt does not fit in the context window."""

    exit_code = 2


class ModelNotFound(LocalspecError):
    """A model name is not in the registry, or its file is not on disk."""

    exit_code = 2


class EmptyPrompt(LocalspecError):
    """There is nothing to complete: an empty prompt argument, file or stdin."""

    exit_code = 2


class ContextTooLarge(LocalspecError):
    """--ctx is above the context the model was trained for (llama.cpp refuses this too)."""

    exit_code = 2


class HubError(LocalspecError):
    """A pull failed: offline, not found, ambiguous quant, or a checksum mismatch."""

    exit_code = 3
