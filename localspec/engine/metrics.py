"""The acceptance log (JSONL, one line per request) and Prometheus text over `Stats`.

Acceptance rate is the one number that says whether speculation still earns its keep, so every request
can leave a line behind: what ran (model, drafter, mode, k chosen), what was drafted and accepted (per
position and per source), how fast. `localspec bench`'s report reads these lines back (`read_log`).

Crash safety: a line is built in memory and written with one `write()` on an O_APPEND descriptor, so a
crash mid-request leaves no line for that request and never half of one. A file whose last line was
cut anyway (power loss, full disk) is repaired on open by dropping the partial tail; readers skip any
line that does not parse.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..speculative.types import ControllerState
from ..tuning.threads import ThreadState
from .stats import Stats

SCHEMA = 1


def request_record(*, model: str, drafter: str, mode: str, stats: Stats, finish: str | None = None,
                   task: str | None = None, controller: ControllerState | None = None,
                   before: ControllerState | None = None, threads: ThreadState | None = None,
                   threads_before: ThreadState | None = None, **extra: Any) -> dict[str, Any]:
    """One log line for one request. `before` is the controller's state when the request started, so
    `k_chosen` counts this request's rounds only (the controller lives across requests)."""
    k_chosen = {str(k): n for k, n in controller.since(before).k_chosen.items()} if controller else {}
    rec: dict[str, Any] = {
        "schema": SCHEMA, "time": round(time.time(), 3), "model": model, "drafter": drafter, "mode": mode,
        "task": task, "finish": finish, "k_chosen": k_chosen,
        "n_prompt": stats.n_prompt, "n_cached": stats.n_cached, "n_generated": stats.n_generated,
        "rounds": stats.rounds, "draft_n": stats.draft_n, "draft_n_accepted": stats.draft_n_accepted,
        "acceptance_rate": stats.acceptance_rate, "mean_acceptance_length": stats.mean_acceptance_length,
        "acceptance_per_position": list(stats.acceptance_per_position),
        "by_source": {s: {"draft_n": d, "draft_n_accepted": a, "acceptance_rate": a / d if d else 0.0}
                      for s, (d, a) in stats.by_source.items()},
        "tokens_per_second": stats.tokens_per_second, "ttft_ms": stats.ttft_ms, "gen_ms": stats.gen_ms,
        "draft_ms": stats.draft_ms, "verify_ms": stats.verify_ms,
    }
    if controller is not None:
        rec.update(adaptive=controller.adaptive, c=controller.c, v=list(controller.v),
                   spec_disabled_reason=controller.spec_disabled_reason)
    if threads is not None:
        rec.update(thread_fields(threads, threads_before))
    rec.update(extra)
    return rec


def thread_fields(state: ThreadState, before: ThreadState | None = None) -> dict[str, Any]:
    """Thread counts in use and this request's switches with their reasons (`before`: state at its start)."""
    new = state.changes[len(before.changes):] if before else state.changes
    return {"threads": state.threads, "threads_batch": state.threads_batch, "threads_draft": state.threads_draft,
            "threads_pinned": state.pinned, "thread_changes": [c.to_dict() for c in new]}


class MetricsLog:
    """Append-only JSONL file; `write(record)` is one atomic append."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)

    def write(self, record: Mapping[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":"), default=_jsonable) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            n = os.write(fd, line)
            if n != len(line):  # disk full: never leave half a line behind
                os.ftruncate(fd, os.fstat(fd).st_size - n)
                raise OSError(f"short write to {self.path} ({n} of {len(line)} bytes)")
        finally:
            os.close(fd)


def repair_tail(path: Path) -> int:
    """Drop a trailing partial line (no final newline). Returns the bytes dropped."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with path.open("r+b") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        pos = size
        while pos > 0:  # scan back in blocks for the last newline
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            i = block.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        else:
            keep = 0
        f.truncate(keep)
        return size - keep


def read_log(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records in order; lines that do not parse as a JSON object are skipped."""
    with Path(path).expanduser().open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                yield rec


def _jsonable(x: Any) -> Any:
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    return str(x)


# -- Prometheus text exposition --------------------------------------------------------------------------------

_COUNTERS = (  # (Stats field, metric name, help)
    ("n_prompt", "prompt_tokens_total", "Prompt tokens evaluated (not counting reused cache)."),
    ("n_cached", "prompt_tokens_cached_total", "Prompt tokens reused from the KV cache."),
    ("n_generated", "tokens_generated_total", "Tokens generated."),
    ("rounds", "verify_rounds_total", "Target passes after prefill (verify rounds)."),
    ("draft_n", "draft_tokens_total", "Draft tokens proposed (llama-server draft_n)."),
    ("draft_n_accepted", "draft_tokens_accepted_total", "Draft tokens accepted (draft_n_accepted)."),
    ("prompt_ms", "prompt_seconds_total", "Seconds spent in prefill."),
    ("gen_ms", "generation_seconds_total", "Seconds spent generating (draft + verify)."),
    ("draft_ms", "draft_seconds_total", "Seconds spent drafting."),
    ("verify_ms", "verify_seconds_total", "Seconds in target verify passes."),
)


def add_stats(a: Stats, b: Stats) -> Stats:
    """Sum two Stats (for totals across requests); per-position and per-source counts add elementwise."""
    vals: dict[str, Any] = {}
    for f in fields(Stats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, tuple):
            n = max(len(x), len(y))
            vals[f.name] = tuple((x[i] if i < len(x) else 0) + (y[i] if i < len(y) else 0) for i in range(n))
        elif isinstance(x, dict):
            vals[f.name] = {s: (x.get(s, (0, 0))[0] + y.get(s, (0, 0))[0], x.get(s, (0, 0))[1] + y.get(s, (0, 0))[1])
                            for s in {**x, **y}}
        elif f.name == "ttft_ms":
            vals[f.name] = max(x, y)  # a total has no single ttft: keep the worst
        else:
            vals[f.name] = x + y
    return Stats(**vals)


def prometheus_text(stats: Stats, *, labels: Mapping[str, str] | None = None, prefix: str = "localspec_",
                    gauges: Mapping[str, float] | None = None) -> str:
    """Prometheus text format (0.0.4) for cumulative `Stats`: counters, per-position and per-source
    acceptance counters, and any extra gauges (e.g. {"queue_depth": 2, "spec_enabled": 1})."""
    lab = _labels(labels or {})
    out: list[str] = []
    for attr, name, help_ in _COUNTERS:
        val = getattr(stats, attr)
        if attr.endswith("_ms"):
            val = val / 1e3
        out += [f"# HELP {prefix}{name} {help_}", f"# TYPE {prefix}{name} counter", f"{prefix}{name}{lab} {val:g}"]
    for name, help_, series in (
            ("draft_position_proposed_total", "Draft tokens proposed at each draft position.", stats.drafted_at),
            ("draft_position_accepted_total", "Draft tokens accepted at each draft position.", stats.accepted_at)):
        out += [f"# HELP {prefix}{name} {help_}", f"# TYPE {prefix}{name} counter"]
        out += [f"{prefix}{name}{_labels({**(labels or {}), 'position': str(i + 1)})} {n}"
                for i, n in enumerate(series)]
    for name, idx, help_ in (("draft_source_proposed_total", 0, "Draft tokens proposed per drafter source."),
                             ("draft_source_accepted_total", 1, "Draft tokens accepted per drafter source.")):
        out += [f"# HELP {prefix}{name} {help_}", f"# TYPE {prefix}{name} counter"]
        out += [f"{prefix}{name}{_labels({**(labels or {}), 'source': s})} {v[idx]}"
                for s, v in sorted(stats.by_source.items())]
    out += [f"# HELP {prefix}acceptance_rate Draft tokens accepted / proposed.",
            f"# TYPE {prefix}acceptance_rate gauge", f"{prefix}acceptance_rate{lab} {stats.acceptance_rate:g}"]
    for name, val in (gauges or {}).items():
        out += [f"# TYPE {prefix}{name} gauge", f"{prefix}{name}{lab} {float(val):g}"]
    return "\n".join(out) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc)) + "}"
