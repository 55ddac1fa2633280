"""The adaptive default against its fixed neighbours: does "auto" keep the promise that nobody has to tune?

For each target, drafter, temperature and task where the bench ran `auto`, the best of plain decoding and the
fixed k rows of the same drafter (pooled over every repeat), and auto's tok/s ÷ that best. A single ratio hides
what matters most here, whether auto's choice holds from run to run, so the ratio is also given per repeat (each
repeat pooled over the task's prompts, auto's repeat against the same repeat of the best row), with its min-max.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .runner import AUTO, PLAIN, Run, TargetResult
from .summary import ALL, decode_tok_s

GOOD = 0.97  # auto within 3 % of the best fixed choice: the promise that a user need not tune


@dataclass(frozen=True)
class AutoVsFixed:
    target: str
    drafter: str
    temp: float
    task: str
    auto_tok_s: float
    best: str  # "plain" or "k=N": the best fixed choice over all repeats
    best_tok_s: float
    ratio: float  # auto ÷ best, pooled over every repeat
    per_repeat: tuple[float, ...]  # auto ÷ best in each repeat, in repeat order

    @property
    def low(self) -> float:
        return min(self.per_repeat, default=self.ratio)

    @property
    def high(self) -> float:
        return max(self.per_repeat, default=self.ratio)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["per_repeat"] = list(self.per_repeat)
        return d


def _choice(r: Run) -> str:
    return "plain" if r.drafter == PLAIN else f"k={r.k}"


def auto_vs_fixed(result: TargetResult) -> list[AutoVsFixed]:
    """One line per (drafter, temperature, task) that has an auto row and at least one fixed neighbour."""
    out = []
    runs = result.runs
    keys = dict.fromkeys((r.drafter, r.temp) for r in runs if r.k == AUTO)
    tasks = list(dict.fromkeys(r.task for r in runs)) + [ALL]
    for drafter, temp in keys:
        for task in tasks:
            mine = [r for r in runs if r.temp == temp and task in (ALL, r.task) and r.drafter in (PLAIN, drafter)]
            auto = [r for r in mine if r.k == AUTO]
            fixed: dict[str, list[Run]] = {}
            for r in mine:
                if r.k != AUTO:
                    fixed.setdefault(_choice(r), []).append(r)
            if not auto or not fixed:
                continue
            best = max(fixed, key=lambda c: decode_tok_s(fixed[c]))
            a, b = decode_tok_s(auto), decode_tok_s(fixed[best])
            repeats = sorted({r.repeat for r in auto})
            per = tuple(decode_tok_s([r for r in auto if r.repeat == i]) / t
                        for i in repeats if (t := decode_tok_s([r for r in fixed[best] if r.repeat == i])) > 0)
            out.append(AutoVsFixed(result.label, drafter, temp, task, a, best, b, a / b if b else 0.0, per))
    return out


def lines(items: Sequence[AutoVsFixed]) -> list[str]:
    """The terminal's block: one line per task, the spread over repeats, and what falls short of GOOD."""
    if not items:
        return []
    out = [f"auto against its fixed neighbours (best of plain and the fixed k rows; ≥ {GOOD:.2f} keeps the "
           "promise that nobody has to tune)"]
    for x in items:
        spread = f" (per repeat {x.low:.2f}-{x.high:.2f})" if len(x.per_repeat) > 1 else ""
        flag = "" if x.low >= GOOD else "  <- below"
        out.append(f"  {x.drafter} T={x.temp:g} {x.task}: auto {x.auto_tok_s:.1f} tok/s, best fixed {x.best} "
                   f"{x.best_tok_s:.1f}: {x.ratio:.2f}×{spread}{flag}")
    return out


def markdown(items: Sequence[AutoVsFixed]) -> list[str]:
    """The Markdown report's section."""
    if not items:
        return []
    out = ["## Auto against its fixed neighbours", "",
           f"Auto's tok/s ÷ the best of plain decoding and the fixed k rows of the same drafter (pooled over "
           f"repeats), and the same ratio in each repeat. {GOOD:.2f} or more keeps the promise.", "",
           "| target | drafter | T | task | auto tok/s | best fixed | tok/s | auto ÷ best | per repeat |",
           "|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {x.target} | {x.drafter} | {x.temp:g} | {x.task} | {x.auto_tok_s:.1f} | {x.best} | "
            f"{x.best_tok_s:.1f} | {x.ratio:.2f} | {', '.join(f'{p:.2f}' for p in x.per_repeat)} |" for x in items]
    return out + [""]
