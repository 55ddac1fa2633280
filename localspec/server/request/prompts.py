"""llama-server's prompt forms, on `/completion`, `/infill`'s `prompt`, `/v1/completions` and `/tokenize`.

A prompt is text (or llama-server's `{"prompt_string": text}`), a list of token ids, or a mixed list of text and
ids (one prompt: the pieces are joined, the first text piece gets BOS as the GGUF asks); a list of those is several
prompts, each answered in turn
(`index` says which). The rule that tells "one mixed prompt" from "several prompts" is llama-server's
(`tokenize_input_prompts`): a flat list holding ids is one prompt; any other list is a list of prompts.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...engine.engine import Engine
from ..execution.worker import Build, Prompt
from ..http import ApiError
from .schemas import MAX_PROMPTS

Piece = int | str
One = str | list[Piece]  # one prompt: text, or token ids and text pieces


def prompt_string(obj: Mapping[str, Any]) -> str:
    """llama-server's object prompt, `{"prompt_string": ..., "multimodal_data": [...]}`: its text (a text model
    takes no multimodal data: a 400, where llama-server refuses it too)."""
    text = obj.get("prompt_string")
    if not isinstance(text, str):
        raise ApiError(400, "an object prompt needs a `prompt_string` text")
    if obj.get("multimodal_data"):
        raise ApiError(400, "multimodal_data is not supported: a text model")
    return text


def split_prompts(prompt: str | Mapping[str, Any] | Sequence[Any]) -> list[One]:
    """The request's prompts, in order (400 for an empty list or a list mixing prompts and ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, Mapping):
        return [prompt_string(prompt)]
    items = [prompt_string(p) if isinstance(p, Mapping) else p for p in prompt]
    if not items:
        raise ApiError(400, "prompt is an empty list: send text, token ids, or a list of prompts")
    flat: list[Piece] = [p for p in items if isinstance(p, (int, str))]
    if len(flat) == len(items) and any(isinstance(p, int) for p in items):
        return [flat]  # token ids, or ids mixed with text: one prompt
    if any(isinstance(p, int) for p in items):
        raise ApiError(400, "prompt mixes token ids with nested prompts: send one flat list or a list of prompts")
    if len(items) > MAX_PROMPTS:
        raise ApiError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(items)}")
    out: list[One] = []
    for p in items:
        if isinstance(p, list):
            if not p:
                raise ApiError(400, "a prompt in the list is empty")
            out.append([x for x in p if isinstance(x, (int, str))])
        else:
            out.append(str(p))
    return out


def checked_prompts(prompt: str | Mapping[str, Any] | Sequence[Any], n_vocab: int) -> list[One]:
    """`split_prompts`, each token id checked against the vocabulary (`/completion`, `/v1/completions`)."""
    prompts = split_prompts(prompt)
    for p in prompts:
        if isinstance(p, list):
            check_ids(p, n_vocab)
    return prompts


def check_ids(pieces: Sequence[Piece], n_vocab: int, what: str = "prompt token ids") -> None:
    """Token ids must name tokens of the vocabulary (llama-server answers 400 too)."""
    bad = [t for t in pieces if isinstance(t, int) and not 0 <= t < n_vocab]
    if bad:
        raise ApiError(400, f"{what} must be in [0, {n_vocab}), got {bad[0]}")


def mixed_tokens(engine: Engine, pieces: Sequence[Piece], *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
    """llama-server's `tokenize_mixed`: ids as they are, text tokenized (BOS only for a leading text piece)."""
    out: list[int] = []
    for i, p in enumerate(pieces):
        if isinstance(p, int):
            out.append(p)
        elif i == 0 and add_special:
            out += engine.tokenize(p, special=parse_special)
        else:
            out += engine.target.tokenize(p, add_special=False, parse_special=parse_special)
    return out


def prompt_input(engine: Engine, prompt: One) -> Prompt:
    """What a job's build returns for one prompt: text stays text (the worker tokenizes it, as before)."""
    return prompt if isinstance(prompt, str) else mixed_tokens(engine, prompt)


def plain_build(prompt: One) -> Build:
    """The job's prompt builder for one prompt without a suffix (runs on the worker, as every build does)."""
    def build(e: Engine) -> tuple[Prompt, bool]:
        return prompt_input(e, prompt), False
    return build
