"""Bench output: the terminal table, the JSON document (schema `localspec.bench/1`) and the Markdown report.

The terminal shows, per target and temperature, one line per configuration: its pooled tok/s, the measured
speedup per task, and over all tasks the measured α, mean acceptance length, TTFT and predicted speedup.
JSON carries everything (rows, raw runs without token ids, costs, agreement, winners, verdict).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from ..models.model_facts import verify_hint
from . import tables, versus
from .runner import PLAIN, Plan, TargetResult
from .summary import ALL, Row, rows_for, verdict, winners

SCHEMA = "localspec.bench/1"


@dataclass(frozen=True)
class Report:
    plan: Plan
    results: tuple[TargetResult, ...]
    rows: tuple[Row, ...]
    verdict: str
    command: str
    partial: bool = False  # interrupted (Ctrl-C): only the runs that finished, no agreement check
    versus: tuple[versus.AutoVsFixed, ...] = ()  # auto against its fixed neighbours (versus.py)

    @classmethod
    def build(cls, plan: Plan, results: Sequence[TargetResult], command: str, *, partial: bool = False) -> "Report":
        rows = tuple(r for res in results for r in rows_for(res))
        vs = tuple(x for res in results for x in versus.auto_vs_fixed(res))
        return cls(plan, tuple(results), rows, verdict(rows), command, partial, vs)

    @property
    def n_runs(self) -> int:
        return sum(len(r.runs) for r in self.results)


def machine() -> dict:
    from ..backend import system_info

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0], "llama_cpp": system_info().strip()}


def to_json(rep: Report) -> dict:
    plan = rep.plan
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": rep.command,
        "partial": rep.partial,
        "machine": machine(),
        "settings": {"ks": list(plan.ks), "auto": plan.auto,
                     "temps": list(plan.temps), "repeat_penalty": plan.repeat_penalty,
                     "repeat_last_n": plan.repeat_last_n, "repeats": plan.repeats, "max_tokens": plan.max_tokens,
                     "n_ctx": plan.n_ctx, "threads": plan.threads, "seed": plan.seed, "busy": plan.busy,
                     "tasks": list(dict.fromkeys(p.task for p in plan.prompts)),
                     "prompts": [p.id for p in plan.prompts]},
        "targets": [{"label": r.label, "path": r.path, "desc": r.n_params_desc, "chat_template": r.chat_template,
                     "costs": r.costs.to_dict()} for r in rep.results],
        "results": [r.to_dict() for r in rep.rows],
        "best": [b.to_dict() for b in winners(rep.rows)],
        "auto_vs_fixed": [x.to_dict() for x in rep.versus],
        "agreement": [a.to_dict() for r in rep.results for a in r.agreement],
        "runs": [_run_dict(run) for r in rep.results for run in r.runs],
        "verdict": rep.verdict,
    }


def _run_dict(run) -> dict:
    d = asdict(run)
    d.pop("tokens")
    for key in ("drafted_at", "accepted_at", "accept_hist"):
        d[key] = list(d[key])
    return d


def write_json(rep: Report, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(rep), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# -- tables -------------------------------------------------------------------------------------------------

def _families(rep: Report):
    for res in rep.results:
        for temp in rep.plan.temps:
            rows = [r for r in rep.rows if r.target == res.label and r.temp == temp]
            if rows:
                yield res, temp, rows


def _tasks(rows: Sequence[Row]) -> list[str]:
    return [t for t in dict.fromkeys(r.task for r in rows) if t != ALL] + [ALL]


def _matrix(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells: one line per configuration, speedup per task, then the all-task measurements."""
    tasks = _tasks(rows)
    head = ["config", "tok/s", *tasks, "pred", "e2e", "α", "len", "ttft ms", "ms/tok"]
    body = []
    for cfg in dict.fromkeys(r.config for r in rows):
        by_task = {r.task: r for r in rows if r.config == cfg}
        a = by_task[ALL]
        spec = a.drafter != PLAIN
        body.append([cfg, f"{a.tokens_per_second:.1f}",
                     *[f"{by_task[t].speedup:.2f}" if t in by_task else "-" for t in tasks],
                     f"{a.predicted_speedup:.2f}" if a.predicted_speedup is not None else "-",
                     f"{a.e2e_speedup:.2f}",
                     f"{a.acceptance_rate:.2f}" if spec else "-",
                     f"{a.mean_acceptance_length:.2f}" if spec else "-",
                     f"{a.ttft_ms:.0f}", f"{a.per_token_ms:.2f}"])
    return head, body


def _table(head: list[str], body: list[list[str]]) -> str:
    """The matrix as a rich table in plain text: configurations left, numbers right."""
    t = tables.grid(*head, right=range(1, len(head)))
    for cells in body:
        tables.add(t, *cells)
    return tables.render(t)


def _costs_line(res: TargetResult) -> str:
    c = ", ".join(f"{k} {v:.3f}" for k, v in res.costs.c.items()) or "-"
    v = " ".join(f"{g}:{x:.2f}" for g, x in sorted(res.costs.v_by_gamma.items()))
    return f"target step {res.costs.t_target_ms:.2f} ms at position {res.costs.position}; c: {c}; v(γ): {v}"


def _threads_line(res: TargetResult, temp: float) -> str:
    """How many threads the runs ended on (chosen at run time unless --threads pinned them)."""
    used = Counter(r.threads for r in res.runs if r.temp == temp)
    return "threads at the end of runs: " + ", ".join(f"{n} ({c} runs)" for n, c in sorted(used.items()))


def busy_line(plan: Plan) -> str:
    return f"Machine made busy: {plan.busy} CPU-bound background process(es) ran for the whole bench (--busy)."


def text_table(rep: Report) -> str:
    out = [busy_line(rep.plan), ""] if rep.plan.busy else []
    for res, temp, rows in _families(rep):
        head, body = _matrix(rows)
        out.append(f"{res.label}  T={temp:g}  (decode speedup vs plain per task; pred = formula with measured α, c, v; "
                   "e2e = whole request)")
        out.append("  " + _costs_line(res))
        if hint := verify_hint(res.path):
            out.append("  " + hint)
        out.append(_table(head, body))
        out.append("  " + _threads_line(res, temp))
        out += ["  " + line for line in versus.lines([x for x in rep.versus
                                                        if (x.target, x.temp) == (res.label, temp)])]
        lost = [r for r in rows if r.drafter != PLAIN and r.task != ALL and r.speedup < 1.0]
        if lost:
            out.append(f"  speculation lost in {len(lost)} of {sum(r.drafter != PLAIN and r.task != ALL for r in rows)}"
                       " (config, task) cells")
        out.append("")
    out += _agreement_lines(rep)
    return "\n".join(out)


def _agreement_lines(rep: Report) -> list[str]:
    agr = [a for r in rep.results for a in r.agreement]
    if not agr:
        return []
    diff = [a for a in agr if not a.agree]
    lines = [f"greedy agreement: {len(agr) - len(diff)} of {len(agr)} spec runs match plain decoding token for token"]
    for a in diff[:8]:
        lines.append(f"  {a.target} {a.drafter} k={a.k} {a.prompt_id}: first divergence at token {a.position}: "
                     f"plain {a.plain_token} vs spec {a.spec_token}; top-2 {a.top1}/{a.top2} gap {a.gap:.2f}"
                     f" -> {'near-tie (numerics)' if a.near_tie else 'NOT a near-tie'}")
    if len(diff) > 8:
        lines.append(f"  ... and {len(diff) - 8} more (see the JSON)")
    return lines


def markdown(rep: Report, plot_name: str | None = None, note: str | None = None) -> str:
    j = to_json(rep)
    m = j["machine"]
    out = ["# localspec bench report", "",
           f"Command: `{rep.command}`", "",
           *([f"**Partial report**: the run was interrupted; {rep.n_runs} finished runs are shown and the greedy "
              "agreement check was skipped.", ""] if rep.partial else []),
           f"Machine: {m['processor']}, {m['cpu_count']} CPUs, {m['platform']}, Python {m['python']}.  ",
           f"Settings: k = {', '.join(map(str, rep.plan.ks))}{' + auto' if rep.plan.auto else ''}; "
           f"temperatures {', '.join(f'{t:g}' for t in rep.plan.temps)}; {len(rep.plan.prompts)} prompts; "
           f"{rep.plan.repeats} repeat(s); max {rep.plan.max_tokens} new tokens; n_ctx {rep.plan.n_ctx}.", "",
           *([busy_line(rep.plan), ""] if rep.plan.busy else []),
           *([note, ""] if note else []),
           "## Verdict", "", rep.verdict, ""]
    if plot_name:
        out += [f"![speedup vs k and acceptance per position]({plot_name})", ""]
    out += ["## Speedup vs plain decoding", "",
            "Cells are measured steady-state decoding speedups (pooled tok/s after the first round ÷ plain's, same "
            "target, temperature and task). `pred` is E(α, γ) ÷ (γc + v(γ)) with this run's α over all tasks and the "
            "measured c and v. `e2e` is the whole-request speedup (prompt, first round and decoding; a model drafter "
            "pays its own prompt prefill there). `tok/s`, `ttft ms` and `ms/tok` are over all tasks.", ""]
    for res, temp, rows in _families(rep):
        head, body = _matrix(rows)
        out += [f"### {res.label}, T={temp:g}", "", f"{res.n_params_desc}; {_costs_line(res)}.", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(b) + " |" for b in body]
        out.append("")
    out += ["## The k that won, and where speculation lost", "",
            "| target | T | task | best | speedup | worst | speedup |", "|---|---|---|---|---|---|---|"]
    out += [f"| {b['target']} | {b['temp']:g} | {b['task']} | {b['config']} | {b['speedup']:.2f} | "
            f"{b['worst_config']} | {b['worst_speedup']:.2f} |" for b in j["best"]]
    out += ["", *versus.markdown(rep.versus)]
    out += ["## Greedy agreement (spec on vs off)", ""] + (_agreement_lines(rep) or ["(no greedy runs)"])
    out += ["", "Batched verify logits differ slightly from single-token logits on CPU, so greedy texts may "
            "diverge at near-ties (top-2 logit gap below 1.0); every emitted token is still the target's own "
            "argmax of the logits it computed.", ""]
    return "\n".join(out)


def write_markdown(rep: Report, path: str | Path, plot: str | Path | None = None, note: str | None = None) -> None:
    p = Path(path)
    rel = os.path.relpath(plot, p.parent) if plot else None
    p.write_text(markdown(rep, rel, note), encoding="utf-8")
