"""The soak's bookkeeping of what each runner was sent (scripts/soak/soak.py), checked against the runner's /metrics.

A runner's counters start at zero with its process, and a router's runners come and go (a crash, keep_alive 0,
an idle sleep), so requests are booked per generation: one process of one model. Before anything that ends a
runner the soak waits until no request is in flight and reads the runner's `localspec_requests_total` by route:
it must equal what the soak sent to that generation. The requests that end a generation (the one that crashes
it, the keep_alive 0 answer) are booked to it after its last reading and cannot be read back; they are counted
apart (`unread`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Gen:
    """One runner process of one model, and the requests sent to it, by route."""

    model: str
    number: int  # 1 for the model's first process
    pid: int | None = None
    sent: Counter = field(default_factory=Counter)
    unread: Counter = field(default_factory=Counter)  # sent after its last reading: the request that ended it
    readings: int = 0
    last_counted: Counter = field(default_factory=Counter)
    last_errors: int = 0  # jobs that ended in an error, at the last reading
    last_cancelled: int = 0  # jobs cancelled by a caller that hung up, at the last reading
    mismatches: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Counts:
    """What a runner's /metrics says: requests by route, jobs that ended in an error, jobs cancelled."""

    routes: Counter
    errors: int
    cancelled: int


def parse_metrics(text: str) -> Counts:
    routes: Counter = Counter()
    errors = cancelled = 0
    for line in text.splitlines():
        if line.startswith("localspec_requests_total{"):
            route = line.split('route="', 1)[1].split('"', 1)[0]
            routes[route] = int(float(line.split()[-1]))
        elif line.startswith("localspec_request_errors_total"):
            errors = int(float(line.split()[-1]))
        elif line.startswith("localspec_requests_cancelled_total"):
            cancelled = int(float(line.split()[-1]))
    return Counts(routes, errors, cancelled)


class Ledger:
    """The generations of each model and the checks made against their counters."""

    def __init__(self, models: list[str]) -> None:
        self.gens: dict[str, list[Gen]] = {m: [Gen(m, 1)] for m in models}
        self.router_answered: Counter = Counter()  # requests the router answers itself (Ollama's unload)
        self.lost: Counter = Counter()  # sent while a runner died: counted by the dead one or by none

    def current(self, model: str) -> Gen:
        return self.gens[model][-1]

    def book(self, model: str, route: str) -> None:
        self.current(model).sent[route] += 1

    def book_last(self, model: str, route: str) -> None:
        """A request that ends the current generation: counted by it, never read back."""
        gen = self.current(model)
        gen.sent[route] += 1
        gen.unread[route] += 1

    def end(self, model: str) -> None:
        """The current process is gone (or going): the next request starts a new generation."""
        self.gens[model].append(Gen(model, len(self.gens[model]) + 1))

    def check(self, model: str, pid: int, counts: Counts) -> str | None:
        """Compare a reading of the model's runner `pid` with what was sent to it; a problem or None."""
        gen = self.current(model)
        if gen.pid is None:
            gen.pid = pid
        elif gen.pid != pid:
            problem = f"{model}: runner {gen.pid} was replaced by {pid} with no event that ends it"
            gen.mismatches.append(problem)
            self.end(model)
            self.current(model).pid = pid
            return problem
        gen.readings += 1
        gen.last_counted = Counter(counts.routes)
        gen.last_errors, gen.last_cancelled = counts.errors, counts.cancelled
        want = {r: n for r, n in gen.sent.items() if n}
        got = {r: n for r, n in counts.routes.items() if n}
        if want != got:
            problem = f"{model} gen {gen.number} (pid {pid}): sent {want}, counted {got}"
            gen.mismatches.append(problem)
            return problem
        return None

    def totals(self) -> dict[str, dict[str, int]]:
        """Per model: requests sent, those read back in a runner's counters, those that ended a runner
        (unread), those lost in a crash, generations, readings and mismatching readings."""
        out: dict[str, dict[str, int]] = {}
        for model, gens in self.gens.items():
            started = [g for g in gens if g.pid is not None or g.sent]
            out[model] = {
                "sent": sum(sum(g.sent.values()) for g in gens) + self.lost[model],
                "counted_read": sum(sum(g.last_counted.values()) for g in gens),
                "ended_runner_unread": sum(sum(g.unread.values()) for g in gens),
                "lost_in_crash": self.lost[model],
                "unread_after_last_reading": sum(sum(g.sent.values()) - sum(g.last_counted.values())
                                                 - sum(g.unread.values()) for g in gens),
                "generations": len(started),
                "readings": sum(g.readings for g in gens),
                "mismatches": sum(len(g.mismatches) for g in gens),
                "errors_read": sum(g.last_errors for g in gens),
                "cancelled_read": sum(g.last_cancelled for g in gens),
            }
        return out
