"""What the router's pool can refuse, each one line for the client: the router's app turns them into the
requesting protocol's error shape (an unknown model is a 404 listing the known ones)."""

from __future__ import annotations

from ..errors import LocalspecError


class RouterError(LocalspecError):
    """Base of the router's refusals."""


class UnknownModel(RouterError):
    """No runner can serve this name: it is not in the catalog (models.toml, --models-dir, hub cache, presets)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(f"model '{name}' not found; known models: {', '.join(self.known) or 'none'}")


class WontFit(RouterError):
    """Loading the model would pass --models-max or the memory available, and nothing idle can make room."""


class NotLoaded(RouterError):
    """--no-models-autoload: a request named a model that is not running, and only /models/load starts one."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"model '{name}' is not loaded and this router loads models only when asked "
                         f"(--no-models-autoload): POST /models/load {{\"model\": \"{name}\"}} first")


class RunnerFailed(RouterError):
    """The model's runner process did not start, or died; the message names the cause (its exit or signal)."""
