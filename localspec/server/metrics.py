"""Server counters in Prometheus text format (`GET /metrics`), fed by the worker as each job ends.

Names follow llama-server's `llamacpp:` metrics where one exists, with `localspec_` for the rest.
"""

from __future__ import annotations

import threading
from collections import Counter

from ..session import Chunk
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

    def request(self, route: str) -> None:
        with self._lock:
            self.requests[route] += 1

    def job_done(self, job: Job, started: Started | None, last: Chunk | None, error: Exception | None) -> None:
        with self._lock:
            if error is not None:
                self.errors += 1
            if started is not None:
                if started.spec:
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
            if s.n_generated > 0 and s.gen_ms > 0:
                tps = s.tokens_per_second
                self.tps_sum += tps
                self.tps_n += 1
                for i, ub in enumerate(TPS_BUCKETS):
                    if tps <= ub:
                        self.tps_counts[i] += 1

    def render(self, *, speculation_enabled: bool, queue_waiting: int, busy: bool) -> str:
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
            lines.append("# HELP localspec_tokens_per_second Generation speed per request.")
            lines.append("# TYPE localspec_tokens_per_second histogram")
            for ub, n in zip(TPS_BUCKETS, self.tps_counts):
                le = "+Inf" if ub == float("inf") else _num(ub)
                lines.append(f'localspec_tokens_per_second_bucket{{le="{le}"}} {n}')
            lines.append(f"localspec_tokens_per_second_sum {_num(self.tps_sum)}")
            lines.append(f"localspec_tokens_per_second_count {self.tps_n}")
            return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"
