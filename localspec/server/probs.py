"""Log-probabilities in each protocol's shape, from the `TokenLogprob`s the loop attaches to each round
(the target's own distribution, see localspec/logprobs.py).

llama.cpp: `completion_probabilities: [{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}]`.
OpenAI chat: `logprobs: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`; OpenAI
completions: the legacy `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`, plus the
`content` list llama-server sends there, so clients of either read it.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..engine.session import Engine
from ..sampling.logprobs import TokenLogprob


def _tok(engine: Engine, t: int) -> tuple[str, list[int]]:
    b = engine.target.piece(t)
    return b.decode("utf-8", "ignore"), list(b)


def _entry(engine: Engine, t: int, lp: float) -> dict[str, Any]:
    text, raw = _tok(engine, t)
    return {"id": t, "token": text, "bytes": raw, "logprob": lp}


def llama_probs(engine: Engine, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's per-token list (also the `content` of OpenAI's logprobs: the same fields plus `id`)."""
    return [_entry(engine, x.token, x.logprob) | {"top_logprobs": [_entry(engine, t, lp) for t, lp in x.top]}
            for x in lps]


def openai_chat(engine: Engine, lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": llama_probs(engine, lps)}


def openai_completion(engine: Engine, lps: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    tokens, offsets = [], []
    for x in lps:
        offsets.append(offset)
        text = _tok(engine, x.token)[0]
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [x.logprob for x in lps],
            "top_logprobs": [{_tok(engine, t)[0]: lp for t, lp in x.top} for x in lps],
            "text_offset": offsets, "content": llama_probs(engine, lps)}
