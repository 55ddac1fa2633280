"""Log-probabilities in each protocol's shape, from the `TokenLogprob`s the loop attaches to each round
(the target's own distribution, see localspec/sampling/logprobs.py).

llama.cpp: `completion_probabilities: [{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}]`.
OpenAI chat: `logprobs: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`; OpenAI
completions: the legacy `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`, plus the
`content` list llama-server sends there, so clients of either read it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...engine.engine import Engine
from ...sampling.logprobs import TokenLogprob
from ...sampling.params import SamplingParams

WINDOW = 1024  # candidates post-sampling probabilities are computed over when top_k is off


def window(n_probs: int, params: SamplingParams, post: bool) -> int:
    """How many raw top tokens to ask the loop for: n_probs, or with `post_sampling_probs` every candidate
    the sampling chain can keep (top_k, else WINDOW)."""
    if not post or params.greedy:
        return max(n_probs, 1) if post else n_probs
    return max(n_probs, params.top_k if params.top_k > 0 else WINDOW)


def _tok(engine: Engine, t: int) -> tuple[str, list[int]]:
    b = engine.target.piece(t)
    return b.decode("utf-8", "ignore"), list(b)


def _entry(engine: Engine, t: int, lp: float) -> dict[str, Any]:
    text, raw = _tok(engine, t)
    return {"id": t, "token": text, "bytes": raw, "logprob": lp}


def llama_probs(engine: Engine, lps: Sequence[TokenLogprob], n_probs: int | None = None,
                post: SamplingParams | None = None) -> list[dict[str, Any]]:
    """llama-server's per-token list (also the `content` of OpenAI's logprobs: the same fields plus `id`).
    `post`: the request's sampling parameters, for `post_sampling_probs` (`prob` and `top_probs`)."""
    if post is not None:
        return [_post_entry(engine, x, post, n_probs) for x in lps]
    return [_entry(engine, x.token, x.logprob) | {"top_logprobs": [_entry(engine, t, lp) for t, lp in x.top[:n_probs]]}
            for x in lps]


def _post_entry(engine: Engine, x: TokenLogprob, params: SamplingParams, n_probs: int | None) -> dict[str, Any]:
    probs = post_sampling(x, params)
    entry = {k: v for k, v in _entry(engine, x.token, 0.0).items() if k != "logprob"}
    top = [{k: v for k, v in _entry(engine, t, 0.0).items() if k != "logprob"} | {"prob": p}
           for t, p in probs[:n_probs]]
    return entry | {"prob": dict(probs).get(x.token, 0.0), "top_probs": top}


def post_sampling(x: TokenLogprob, params: SamplingParams) -> list[tuple[int, float]]:
    """The candidates llama.cpp's chain keeps (top-k, top-p, min-p, then temperature) with their probabilities,
    most likely first, from the raw top tokens the loop reported. Greedy keeps the one best token."""
    cands = list(x.top) or [(x.token, x.logprob)]
    if params.greedy:
        return [(cands[0][0], 1.0)]
    if params.top_k > 0:
        cands = cands[:params.top_k]
    lp = np.array([v for _, v in cands], dtype=np.float64)
    if params.top_p < 1.0:
        p = np.exp(lp - lp.max())
        p /= p.sum()
        keep = int(np.searchsorted(np.cumsum(p), params.top_p)) + 1
        cands, lp = cands[:keep], lp[:keep]
    if params.min_p > 0.0:
        keep = max(1, int(np.sum(lp - lp[0] >= np.log(params.min_p))))
        cands, lp = cands[:keep], lp[:keep]
    z = lp / max(params.temperature, 1e-6)
    p = np.exp(z - z.max())
    p /= p.sum()
    return [(t, float(q)) for (t, _), q in zip(cands, p)]


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
