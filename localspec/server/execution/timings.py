"""The statistics blocks every response carries: llama-server's `timings` (and `prompt_progress`), and our
`speculative` block (did this request draft, why not, how well it did)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...engine.engine import Engine
from ...engine.stats import Stats
from ..state import State
from .worker import Job, Started

if TYPE_CHECKING:
    from .run import Run


def predicted_rate(s: Stats, first: Stats | None) -> float:
    """Generated tokens per second after the first round, as llama-server counts it: its first token comes out
    of the pass that evaluates the prompt's last token (prompt time), ours out of the first verify round. One
    token alone has no generation step to time: 0, as llama-server reports it."""
    if s.n_generated <= 1:
        return 0.0
    if first is None or s.n_generated <= first.n_generated or s.gen_ms <= first.gen_ms:
        return s.tokens_per_second
    return (s.n_generated - first.n_generated) / ((s.gen_ms - first.gen_ms) / 1e3)


def progress_events(job: Job) -> list[dict[str, Any]]:
    """llama-server's `prompt_progress` events: the cached part first (processed = cache), then one a prefill
    batch, the last one the whole prompt (its last tokens are evaluated with the first round). They are sent once
    the first round is done, where llama-server sends each as its batch ends: the same events, later."""
    first = job.first
    assert first is not None, "progress_events after the job started"
    total, cache = first.n_prompt + first.n_cached, first.n_cached
    marks = job.prefill or [(cache, 0.0)]
    t0 = marks[0][1]
    out = [{"total": total, "cache": cache, "processed": n, "time_ms": (t - t0) * 1e3} for n, t in marks]
    if out[-1]["processed"] < total:
        out.append({"total": total, "cache": cache, "processed": total, "time_ms": first.prompt_ms})
    return out


def timings(s: Stats, first: Stats | None = None) -> dict[str, Any]:
    """llama-server's `timings` block, plus its speculative counters."""
    return {
        "cache_n": s.n_cached,
        "prompt_n": s.n_prompt,
        "prompt_ms": s.prompt_ms,
        "prompt_per_token_ms": s.prompt_ms / s.n_prompt if s.n_prompt else 0.0,
        "prompt_per_second": s.prompt_per_second,
        "predicted_n": s.n_generated,
        "predicted_ms": s.gen_ms,
        "predicted_per_token_ms": s.gen_ms / s.n_generated if s.n_generated > 1 else 0.0,
        "predicted_per_second": predicted_rate(s, first),
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
