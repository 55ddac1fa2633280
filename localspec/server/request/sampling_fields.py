"""Request fields -> the job's sampling parameters and stop strings, with each protocol's defaults filled in."""

from __future__ import annotations

from typing import Any, Sequence

from ...sampling.params import SamplingParams
from ..http import ApiError

PENALTIES = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")


def sampling(temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
             seed: int | None, *, defaults: dict[str, float], penalties: Any = None,
             **extra: Any) -> SamplingParams:
    """Protocol defaults filled in; top_p 0 means "off" in some clients, as does seed -1. `penalties`: the
    request (or Ollama options) object carrying repeat_penalty & co; `extra`: request-level fields (logprobs,
    constraint)."""
    get = lambda v, k: defaults.get(k, 0) if v is None else v  # noqa: E731
    tp = float(get(top_p, "top_p") or 1.0)
    for name in PENALTIES:
        v = getattr(penalties, name, None)
        if v is not None or name in defaults:
            extra[name] = v if v is not None else defaults[name]
    try:
        return SamplingParams(temperature=float(get(temperature, "temperature")), top_k=int(get(top_k, "top_k")),
                              top_p=tp, min_p=float(get(min_p, "min_p")),
                              seed=None if seed is None or seed < 0 else int(seed), **extra)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """A request's `stop` (one string or a list; empty strings dropped: they would end every completion)."""
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
