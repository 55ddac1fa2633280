"""Generation statistics, named as llama-server and vLLM name them (docs/design.md, "Statistics").

`StatsCounter` folds `Step`s as they arrive; `snapshot()` returns a frozen `Stats` that front ends print.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..speculative.types import Step


@dataclass(frozen=True)
class Stats:
    n_prompt: int = 0  # prompt tokens evaluated (not counting reused cache)
    n_cached: int = 0  # prompt tokens reused from the KV cache
    prompt_ms: float = 0.0
    ttft_ms: float = 0.0  # request start -> first token out
    n_generated: int = 0
    gen_ms: float = 0.0  # first round start -> last token (excludes prefill)
    rounds: int = 0  # verify rounds (target passes after prefill)
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    drafted_at: tuple[int, ...] = ()  # per draft position: how often it was proposed
    accepted_at: tuple[int, ...] = ()  # ... and accepted
    by_source: dict[str, tuple[int, int]] = field(default_factory=dict)  # source -> (draft_n, accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target pass: 1 + accepted / rounds (vLLM's definition)."""
        return 1.0 + self.draft_n_accepted / self.rounds if self.rounds else 0.0

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at))

    @property
    def tokens_per_second(self) -> float:
        return self.n_generated / (self.gen_ms / 1e3) if self.gen_ms > 0 else 0.0

    @property
    def prompt_per_second(self) -> float:
        """Prefill throughput; 0 for a prompt of one token, whose time is one decode step, not a prefill rate."""
        return self.n_prompt / (self.prompt_ms / 1e3) if self.prompt_ms > 0 and self.n_prompt > 1 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, mean_acceptance_length=self.mean_acceptance_length,
                 acceptance_per_position=list(self.acceptance_per_position),
                 tokens_per_second=self.tokens_per_second, prompt_per_second=self.prompt_per_second,
                 drafted_at=list(self.drafted_at), accepted_at=list(self.accepted_at),
                 by_source={k: {"draft_n": v[0], "draft_n_accepted": v[1]} for k, v in self.by_source.items()})
        return d

    def line(self) -> str:
        """One human line for stderr / status bars."""
        pps = f" {self.prompt_per_second:.0f} tok/s" if self.prompt_per_second else ""
        s = (f"{self.n_generated} tokens, {self.tokens_per_second:.1f} tok/s, ttft {self.ttft_ms:.0f} ms, "
             f"prompt {self.n_prompt} tok ({self.n_cached} cached){pps}")
        if self.draft_n:
            s += (f", accepted {self.draft_n_accepted}/{self.draft_n} ({100 * self.acceptance_rate:.0f}%), "
                  f"{self.mean_acceptance_length:.2f} tok/pass")
        return s


class StatsCounter:
    """Mutable accumulator over the Steps of one request."""

    def __init__(self, t_start: float | None = None) -> None:
        self.t_start = t_start if t_start is not None else time.perf_counter()
        self.n_prompt = self.n_cached = self.n_generated = self.rounds = self.draft_n = self.accepted = 0
        self.prompt_ms = self.ttft_ms = self.gen_ms = self.draft_ms = self.verify_ms = 0.0
        self._gen_start = 0.0
        self.drafted_at: list[int] = []
        self.accepted_at: list[int] = []
        self.by_source: dict[str, list[int]] = {}

    def add(self, step: Step) -> None:
        now = time.perf_counter()
        if self.rounds == 0:
            self.n_prompt, self.n_cached, self.prompt_ms = step.n_prompt, step.n_cached, step.t_prompt * 1e3
            self.ttft_ms = (now - self.t_start) * 1e3
            self._gen_start = now - (step.t_draft + step.t_verify)  # when the first round began
        self.rounds += 1
        self.n_generated += len(step.tokens)
        # wall clock, not the sum of the rounds: the time between rounds (the engine, the thread controller,
        # whoever consumes the stream) is part of what a user waits for
        self.gen_ms = (now - self._gen_start) * 1e3
        self.draft_ms += step.t_draft * 1e3
        self.verify_ms += step.t_verify * 1e3
        self.draft_n += step.drafted
        self.accepted += step.accepted
        if step.drafted:
            src = self.by_source.setdefault(step.source or "draft", [0, 0])
            src[0] += step.drafted
            src[1] += step.accepted
        while len(self.drafted_at) < step.drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(step.drafted):
            self.drafted_at[i] += 1
            if i < step.accepted:
                self.accepted_at[i] += 1

    def snapshot(self) -> Stats:
        return Stats(self.n_prompt, self.n_cached, self.prompt_ms, self.ttft_ms, self.n_generated, self.gen_ms,
                     self.rounds, self.draft_n, self.accepted, self.draft_ms, self.verify_ms,
                     tuple(self.drafted_at), tuple(self.accepted_at),
                     {k: (v[0], v[1]) for k, v in self.by_source.items()})
