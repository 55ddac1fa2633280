"""The statistics blocks every response carries: llama-server's `timings` (and `prompt_progress`), and our
`speculative` block (did this request draft, why not, how well it did)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...engine.engine import Engine
from ...engine.stats import Stats
from ..state import State
from .worker import Progress, Started

if TYPE_CHECKING:
    from .run import Run


def generation_steps(s: Stats) -> int:
    """The generated tokens llama-server counts a decode step for: all but the first, which comes out of the pass
    that reads the prompt's last token. One token alone has no step: its rate and per-token time are 0."""
    return max(s.n_generated - 1, 0)


def progress_block(p: Progress) -> dict[str, Any]:
    """llama-server's `prompt_progress` object: the prompt's tokens, those reused from the cache, those in the
    cache now, and the milliseconds since the prefill began."""
    return {"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms}


def progress_timings(p: Progress) -> dict[str, Any]:
    """The `timings` block a progress event carries (with `timings_per_token`), as llama-server fills it
    mid-prefill: the prompt tokens evaluated so far and their time, nothing generated yet."""
    n = p.processed - p.cache
    return timings(Stats(n_prompt=n, n_cached=p.cache, prompt_ms=p.time_ms))


def progress_fields(p: Progress, with_timings: bool) -> dict[str, Any]:
    """A progress event's fields: `prompt_progress`, and its `timings` when the request asks for them each
    step (`timings_per_token`)."""
    return {"prompt_progress": progress_block(p), **({"timings": progress_timings(p)} if with_timings else {})}


def timings(s: Stats) -> dict[str, Any]:
    """llama-server's `timings` block, plus its speculative counters. The generation rate is over the decode
    steps after the first token, in `predicted_ms` (llama-server's: 15 steps for 16 tokens)."""
    steps = generation_steps(s)
    return {
        "cache_n": s.n_cached,
        "prompt_n": s.n_prompt,
        "prompt_ms": s.prompt_ms,
        "prompt_per_token_ms": s.prompt_ms / s.n_prompt if s.n_prompt else 0.0,
        "prompt_per_second": s.prompt_per_second,
        "predicted_n": s.n_generated,
        "predicted_ms": s.gen_ms,
        "predicted_per_token_ms": s.gen_ms / steps if steps and s.gen_ms > 0 else 0.0,
        "predicted_per_second": 1e3 / s.gen_ms * steps if steps and s.gen_ms > 0 else 0.0,
        "draft_n": s.draft_n,
        "draft_n_accepted": s.draft_n_accepted,
    }


def spec_policy(engine: Engine) -> tuple[str, int]:
    """(how γ is chosen: "auto" or the pinned γ, γ in use now; 0 = off). The one place the server reads the
    engine's draft-length policy."""
    if engine.drafter is None:
        return "off", 0
    return engine.controller.policy()


def speculative(state: State, run: Run) -> dict[str, Any]:
    """Our extra field: did this request draft (`enabled`: drafts were actually made), why not, and how well
    it did. `mode` and `k` follow the one rule every front end uses (`outcome.outcome`): k is the γ the
    controller chose in most of this request's rounds; `k_policy` says how γ is chosen."""
    s, started = run.stats, run.started
    out = run.last.outcome if run.last else None
    policy, _ = spec_policy(state.engine)
    d: dict[str, Any] = {"enabled": s.draft_n > 0, "mode": out.mode if out else "plain",
                         "drafter": state.engine.drafter_name, "k_policy": policy, "k": out.k if out else 0,
                         "draft_n": s.draft_n, "draft_n_accepted": s.draft_n_accepted,
                         "acceptance_rate": s.acceptance_rate,
                         "mean_acceptance_length": s.mean_acceptance_length,
                         "tokens_per_second": s.tokens_per_second, "ttft_ms": s.ttft_ms}
    if not s.draft_n:
        d["reason"] = _no_draft_reason(state, started)
    return d


def _no_draft_reason(state: State, started: Started | None) -> str:
    if started is None:
        return "not started"
    if not started.speculate:
        return started.reason
    reason = state.engine.controller.state().spec_disabled_reason
    if reason:
        return reason
    return "no draft was proposed (prompt lookup found no match, or the request ended first)"
