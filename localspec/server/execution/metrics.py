"""Server counters in Prometheus text format (`GET /metrics`), fed by the worker as each job ends.

llama-server's `llamacpp:` series keep their names and meanings (Grafana boards built for llama-server work);
`localspec_` names the rest. The /metrics response also carries llama-server's `Process-Start-Time-Unix` header.
"""

from __future__ import annotations

import threading
from collections import Counter

from ...engine.engine import Chunk
from .worker import Job, Started

# tokens/s histogram buckets (upper bounds)
TPS_BUCKETS = (5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0, float("inf"))


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # route -> count (counted when answered)
        self.errors = 0
        self.cancelled = 0
        self.prompt_tokens = self.prompt_tokens_cached = self.generated_tokens = 0
        self.draft_n = self.draft_n_accepted = 0
        self.spec_on = self.spec_off = 0
        self.tps_counts = [0] * len(TPS_BUCKETS)
        self.tps_sum = 0.0
        self.tps_n = 0
        self.prompt_s = self.predicted_s = 0.0
        self.rate_n, self.rate_s = 0, 0.0  # tokens and seconds after each request's first round
        self.n_decode = self.n_tokens_max = self.draft_rounds = 0
        self.accepted_at: list[int] = []  # per draft position

    def request(self, route: str) -> None:
        with self._lock:
            self.requests[route] += 1

    def job_done(self, job: Job, started: Started | None, last: Chunk | None, error: Exception | None) -> None:
        with self._lock:
            if error is not None:
                self.errors += 1
            if started is not None:
                if started.speculate:
                    self.spec_on += 1
                else:
                    self.spec_off += 1
            if last is None:
                return
            s = last.stats
            if last.finish == "cancelled":
                self.cancelled += 1
            self.prompt_tokens += s.n_prompt
            self.prompt_tokens_cached += s.n_cached
            self.generated_tokens += s.n_generated
            self.draft_n += s.draft_n
            self.draft_n_accepted += s.draft_n_accepted
            self.prompt_s += s.prompt_ms / 1e3
            self.predicted_s += s.gen_ms / 1e3
            f = job.first
            if f is not None and s.n_generated > f.n_generated and s.gen_ms > f.gen_ms:
                self.rate_n += s.n_generated - f.n_generated
                self.rate_s += (s.gen_ms - f.gen_ms) / 1e3
            self.n_decode += s.rounds + (1 if s.n_prompt > 1 else 0)  # verify passes + the prefill
            self.n_tokens_max = max(self.n_tokens_max, s.n_prompt + s.n_cached + s.n_generated)
            self.draft_rounds += s.drafted_at[0] if s.drafted_at else 0
            for i, a in enumerate(s.accepted_at):
                if i >= len(self.accepted_at):
                    self.accepted_at.append(0)
                self.accepted_at[i] += a
            if s.n_generated > 0 and s.gen_ms > 0:
                tps = s.tokens_per_second
                self.tps_sum += tps
                self.tps_n += 1
                for i, ub in enumerate(TPS_BUCKETS):
                    if tps <= ub:
                        self.tps_counts[i] += 1

    def render(self, *, speculation_enabled: bool, queue_waiting: int, busy: bool, kv_tokens: int = 0,
               n_ctx: int = 0) -> str:
        with self._lock:
            rate = self.draft_n_accepted / self.draft_n if self.draft_n else 0.0
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(f"{name}{labels} {_num(v)}" for labels, v in samples)

            metric("localspec_requests_total", "counter", "HTTP generation requests answered, by route.",
                   [(f'{{route="{r}"}}', n) for r, n in sorted(self.requests.items())] or [("", 0)])
            metric("localspec_request_errors_total", "counter", "Jobs that ended with an error.", [("", self.errors)])
            metric("localspec_requests_cancelled_total", "counter", "Jobs cancelled by a client disconnect.",
                   [("", self.cancelled)])
            metric("llamacpp:prompt_tokens_total", "counter", "Prompt tokens evaluated.", [("", self.prompt_tokens)])
            metric("localspec_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV cache.",
                   [("", self.prompt_tokens_cached)])
            metric("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
            metric("localspec_draft_n_total", "counter", "Draft tokens proposed (draft_n).", [("", self.draft_n)])
            metric("localspec_draft_n_accepted_total", "counter", "Draft tokens accepted (draft_n_accepted).",
                   [("", self.draft_n_accepted)])
            metric("localspec_acceptance_rate", "gauge", "draft_n_accepted / draft_n since start.", [("", rate)])
            metric("localspec_speculation_enabled", "gauge", "1 when a drafter is loaded.",
                   [("", 1 if speculation_enabled else 0)])
            metric("localspec_jobs_total", "counter", "Jobs by speculation mode.",
                   [('{speculative="on"}', self.spec_on), ('{speculative="off"}', self.spec_off)])
            metric("llamacpp:requests_deferred", "gauge", "Requests waiting for the worker.", [("", queue_waiting)])
            metric("llamacpp:requests_processing", "gauge", "Requests being generated.", [("", 1 if busy else 0)])
            self._llamacpp(metric, kv_tokens, n_ctx)
            lines.append("# HELP localspec_tokens_per_second Generation speed per request.")
            lines.append("# TYPE localspec_tokens_per_second histogram")
            for ub, n in zip(TPS_BUCKETS, self.tps_counts):
                le = "+Inf" if ub == float("inf") else _num(ub)
                lines.append(f'localspec_tokens_per_second_bucket{{le="{le}"}} {n}')
            lines.append(f"localspec_tokens_per_second_sum {_num(self.tps_sum)}")
            lines.append(f"localspec_tokens_per_second_count {self.tps_n}")
            return "\n".join(lines) + "\n"

    def _llamacpp(self, metric, kv_tokens: int, n_ctx: int) -> None:
        """llama-server's other series (its speculative ones included), same names, same units."""
        per_s = lambda n, s: n / s if s > 0 else 0.0  # noqa: E731
        metric("llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache",
               [("", self.prompt_tokens_cached)])
        metric("llamacpp:prompt_seconds_total", "counter", "Total time spent processing prompts",
               [("", self.prompt_s)])
        metric("llamacpp:tokens_predicted_seconds_total", "counter", "Total time spent generating tokens",
               [("", self.predicted_s)])
        metric("llamacpp:n_decode_total", "counter", "Target passes (prefills and verify rounds)",
               [("", self.n_decode)])
        metric("llamacpp:n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)",
               [("", self.n_tokens_max)])
        metric("llamacpp:spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated",
               [("", self.draft_n)])
        metric("llamacpp:spec_decode_num_accepted_tokens_total", "counter",
               "Speculative: Total draft tokens accepted by the target model", [("", self.draft_n_accepted)])
        metric("llamacpp:spec_decode_num_drafts_total", "counter",
               "Speculative: Total speculative decoding verification steps", [("", self.draft_rounds)])
        metric("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s",
               [("", per_s(self.prompt_tokens, self.prompt_s))])
        metric("llamacpp:predicted_tokens_seconds", "gauge",
               "Average generation throughput in tokens/s (after each request's first token)",
               [("", per_s(self.rate_n, self.rate_s))])
        metric("llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
               [("", 1.0 if self.n_decode else 0.0)])
        metric("llamacpp:kv_cache_tokens", "gauge", "KV cache tokens (the target's)", [("", kv_tokens)])
        metric("llamacpp:kv_cache_usage_ratio", "gauge", "KV cache usage: tokens / n_ctx",
               [("", kv_tokens / n_ctx if n_ctx else 0.0)])
        if self.accepted_at:
            metric("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                   "Accepted tokens per draft position",
                   [(f'{{position="{i}"}}', n) for i, n in enumerate(self.accepted_at)])


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"
