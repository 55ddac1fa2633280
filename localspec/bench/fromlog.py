"""`localspec bench --from-log FILE`: acceptance on real traffic, from the metrics JSONL log of real sessions.

The log (localspec/engine/metrics.py) holds one JSON object per request. It is read defensively: lines that are not
JSON objects, and fields that are missing or of the wrong type, are skipped and counted, never fatal.
Rows pool draft_n / draft_n_accepted per (model, drafter, mode, k, task), and give the expected tokens per
verify round E(α, k) the theory predicts from that α.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .tasks import BenchInputError
from .theory import expected_tokens


@dataclass(frozen=True)
class LogRow:
    model: str
    drafter: str
    mode: str
    k: int | str
    task: str
    requests: int
    draft_n: int
    draft_n_accepted: int
    acceptance_rate: float
    acceptance_per_position: tuple[float, ...]
    tokens_per_second: float  # mean over requests that logged it
    expected_tokens_per_round: float | None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance_per_position"] = list(self.acceptance_per_position)
        return d


def _num(x, default=0):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else default


def read_log(path: str | Path) -> tuple[list[LogRow], int]:
    """Rows, and the number of lines skipped as unreadable."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise BenchInputError(f"log file not found: {p} (the metrics JSONL that 'localspec serve/chat' write)")
    groups: dict[tuple, dict] = {}
    skipped = 0
    with p.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if not isinstance(obj, dict):
                skipped += 1
                continue
            k = _k_of(obj)
            key = (str(obj.get("model", "?")), str(obj.get("drafter", "?")), str(obj.get("mode", "?")),
                   k if isinstance(k, (int, str)) else "?", str(obj.get("task") or "-"))
            g = groups.setdefault(key, {"n": 0, "dn": 0, "da": 0, "pos": [], "tps": []})
            g["n"] += 1
            g["dn"] += int(_num(obj.get("draft_n")))
            g["da"] += int(_num(obj.get("draft_n_accepted")))
            pos = obj.get("acceptance_per_position")
            if isinstance(pos, list):
                g["pos"].append([_num(x, 0.0) for x in pos])
            tps = _num(obj.get("tokens_per_second"), None)
            if tps is not None:
                g["tps"].append(float(tps))
    if not groups:
        raise BenchInputError(f"{p} holds no readable records ({skipped} lines skipped)")
    return [_row(key, g) for key, g in groups.items()], skipped


def _k_of(obj: dict) -> int | str:
    """The logged k; else "auto" for adaptive sessions; else the k chosen most often; else 0 (plain)."""
    k = obj.get("k")
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    if obj.get("adaptive"):
        return "auto"
    chosen = obj.get("k_chosen")
    if isinstance(chosen, dict) and chosen:
        best = max(chosen.items(), key=lambda kv: _num(kv[1]))[0]
        return int(best) if str(best).isdigit() else 0
    return 0


def _row(key: tuple, g: dict) -> LogRow:
    model, drafter, mode, k, task = key
    alpha = g["da"] / g["dn"] if g["dn"] else 0.0
    width = max((len(p) for p in g["pos"]), default=0)
    pos = tuple(sum(p[i] for p in g["pos"] if i < len(p)) / max(1, sum(i < len(p) for p in g["pos"]))
                for i in range(width))
    e = expected_tokens(min(alpha, 1.0), k) if isinstance(k, int) and k > 0 and g["dn"] else None
    return LogRow(model, drafter, mode, k, task, g["n"], g["dn"], g["da"], alpha, pos,
                  sum(g["tps"]) / len(g["tps"]) if g["tps"] else 0.0, e)


def log_table(rows: list[LogRow], skipped: int) -> str:
    head = ["model", "drafter", "mode", "k", "task", "requests", "α", "E(α,k)", "tok/s", "acceptance per position"]
    body = [[r.model, r.drafter, r.mode, str(r.k), r.task, str(r.requests), f"{r.acceptance_rate:.2f}",
             f"{r.expected_tokens_per_round:.2f}" if r.expected_tokens_per_round else "-",
             f"{r.tokens_per_second:.1f}", " ".join(f"{x:.2f}" for x in r.acceptance_per_position)] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in [head, *body]]
    if skipped:
        lines.append(f"({skipped} unreadable line(s) skipped)")
    return "\n".join(lines)
