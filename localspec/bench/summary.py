"""From raw runs to the numbers a user reads: per (target, config, temperature, task) rows, the measured and
predicted speedup, the k that won, where speculation lost, and a one-paragraph verdict.

Throughput is pooled (total tokens ÷ total time) rather than averaged per prompt, so a long answer weighs as
much as its tokens. `speedup` is steady-state decoding (rounds after the first; the first round is part of TTFT
and, for a model drafter, holds the drafter's own prompt prefill) — what the formula predicts; `e2e_speedup`
is the whole request, prompt included. Speedup is against plain decoding of the same target, temperature and
task, measured in the same interleaved run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from .runner import PLAIN, Run, TargetResult
from .theory import best_gamma, conditional_alpha, measured_speedup

ALL = "all"
WIN, LOSS = 1.05, 0.95  # a configuration "wins" / "loses" beyond ±5 % (timing noise on a shared machine)


@dataclass(frozen=True)
class Row:
    target: str
    drafter: str
    k: int | str
    temp: float
    task: str
    n_runs: int
    n_generated: int
    tokens_per_second: float  # steady-state decoding: rounds after the first (the first is in TTFT)
    per_token_ms: float
    ttft_ms: float
    e2e_tokens_per_second: float  # whole request: tokens ÷ (TTFT + the remaining rounds)
    acceptance_rate: float
    mean_acceptance_length: float
    acceptance_per_position: tuple[float, ...]
    accept_hist: tuple[int, ...]
    draft_n: int
    draft_n_accepted: int
    speedup: float  # measured steady-state decoding speedup vs plain (what the formula predicts)
    e2e_speedup: float  # whole-request speedup vs plain, prompt and first round included
    c: float | None  # drafter cost used by the prediction
    v: float | None  # v(k)
    predicted_speedup: float | None
    predicted_best_k: int | None  # the γ the formula picks from the measured α, c, v

    @property
    def config(self) -> str:
        return "plain" if self.drafter == PLAIN else f"{self.drafter} k={self.k}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = self.config
        d["acceptance_per_position"] = list(self.acceptance_per_position)
        d["accept_hist"] = list(self.accept_hist)
        return d


def _sum_lists(rows: Iterable[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for r in rows:
        out.extend([0] * (len(r) - len(out)))
        for i, x in enumerate(r):
            out[i] += x
    return out


def decode_tok_s(runs: Sequence[Run]) -> float:
    """Steady-state decoding tok/s of runs pooled: the tokens of the rounds after the first ÷ their time."""
    n = sum(r.n_generated - r.first_tokens for r in runs)
    ms = sum(r.gen_ms - r.first_ms for r in runs)
    return n / (ms / 1e3) if ms else 0.0


def _pool(runs: Sequence[Run]) -> dict:
    n = sum(r.n_generated - r.first_tokens for r in runs)
    ms = sum(r.gen_ms - r.first_ms for r in runs)
    e2e_ms = sum(r.ttft_ms + r.gen_ms - r.first_ms for r in runs)
    n_all = sum(r.n_generated for r in runs)
    rounds = sum(r.rounds for r in runs)
    dn, da = sum(r.draft_n for r in runs), sum(r.draft_n_accepted for r in runs)
    drafted, accepted = _sum_lists(r.drafted_at for r in runs), _sum_lists(r.accepted_at for r in runs)
    return dict(n_runs=len(runs), n_generated=n_all, tokens_per_second=decode_tok_s(runs),
                per_token_ms=ms / n if n else 0.0, ttft_ms=sum(r.ttft_ms for r in runs) / len(runs),
                e2e_tokens_per_second=n_all / (e2e_ms / 1e3) if e2e_ms else 0.0,
                acceptance_rate=da / dn if dn else 0.0,
                mean_acceptance_length=1.0 + da / rounds if rounds else 0.0,
                acceptance_per_position=tuple(a / d if d else 0.0 for a, d in zip(accepted, drafted)),
                accept_hist=tuple(_sum_lists(r.accept_hist for r in runs)), draft_n=dn, draft_n_accepted=da)


def rows_for(result: TargetResult) -> list[Row]:
    groups: dict[tuple, list[Run]] = {}
    for r in result.runs:
        for task in (r.task, ALL):
            groups.setdefault((r.drafter, r.k, r.temp, task), []).append(r)
    v_all = result.costs.v_by_gamma
    pooled = {key: _pool(runs) for key, runs in groups.items()}
    rows = []
    for (drafter, k, temp, task), p in pooled.items():
        base = pooled.get((PLAIN, 0, temp, task))
        ratio = lambda key: p[key] / base[key] if base and base[key] else 0.0  # noqa: E731
        speedup, e2e = ratio("tokens_per_second"), ratio("e2e_tokens_per_second")
        c = result.costs.c.get(drafter) if drafter != PLAIN else None
        v = v_all.get(k) if isinstance(k, int) else None
        # from the rounds' own tokens per round: the drafted-token acceptance in E(α, γ) assumes independent
        # positions, and a model drafter's accepted tokens come in runs (theory.measured_speedup)
        length = p["mean_acceptance_length"]
        pred = measured_speedup(length, k, c, v) if c is not None and v is not None and length else None
        alpha = conditional_alpha(length, k) if isinstance(k, int) else p["acceptance_rate"]
        best_k = best_gamma(alpha, c, v_all)[0] if c is not None else None
        rows.append(Row(result.label, drafter, k, temp, task, **p, speedup=speedup, e2e_speedup=e2e, c=c, v=v,
                        predicted_speedup=pred, predicted_best_k=best_k))
    order = {t: i for i, t in enumerate(_tasks(result.runs) + [ALL])}
    rows.sort(key=lambda r: (r.temp, r.drafter != PLAIN, r.drafter, _k_order(r.k), order[r.task]))
    return rows


def _k_order(k: int | str) -> int:
    return k if isinstance(k, int) else 10 ** 6


def _tasks(runs: Sequence[Run]) -> list[str]:
    seen: list[str] = []
    for r in runs:
        if r.task not in seen:
            seen.append(r.task)
    return seen


@dataclass(frozen=True)
class Best:
    target: str
    temp: float
    task: str
    config: str
    speedup: float
    worst_config: str
    worst_speedup: float

    def to_dict(self) -> dict:
        return asdict(self)


def winners(rows: Sequence[Row]) -> list[Best]:
    """Per (target, temperature, task): the best and the worst speculative configuration."""
    out = []
    keys = dict.fromkeys((r.target, r.temp, r.task) for r in rows)
    for target, temp, task in keys:
        spec = [r for r in rows if (r.target, r.temp, r.task) == (target, temp, task) and r.drafter != PLAIN]
        if not spec:
            continue
        b = max(spec, key=lambda r: r.speedup)
        w = min(spec, key=lambda r: r.speedup)
        out.append(Best(target, temp, task, b.config, b.speedup, w.config, w.speedup))
    return out


def _pct(s: float) -> str:
    return f"{s:.2f}×" if s >= 0.995 else f"{s:.2f}× (loses {100 * (1 - s):.0f} %)"


def verdict(rows: Sequence[Row]) -> str:
    """One paragraph per target and temperature: which tasks speculation wins, which it loses, what to do."""
    parts = []
    bests = winners(rows)
    for target, temp in dict.fromkeys((b.target, b.temp) for b in bests):
        mine = [b for b in bests if (b.target, b.temp) == (target, temp)]
        tasks = [b for b in mine if b.task != ALL]
        overall = next((b for b in mine if b.task == ALL), None)
        won = [b for b in tasks if b.speedup >= WIN]
        lost = [b for b in tasks if b.speedup < LOSS]
        s = f"On {target} (T={temp:g}): "
        if won:
            s += "; ".join(f"on {b.task} {b.config} gives {b.speedup:.2f}×" for b in won)
        if lost:
            s += ("; " if won else "") + "; ".join(
                f"on {b.task} even the best ({b.config}) loses {100 * (1 - b.speedup):.0f} %" for b in lost)
        if not won and not lost:
            s += "speculation is within ±5 % of plain decoding on every task"
        if overall:
            s += f". Over all tasks the best is {overall.config} at {_pct(overall.speedup)}"
        pred = next((r for r in rows if r.target == target and r.temp == temp and r.task == ALL
                     and r.config == (overall.config if overall else None)), None)
        if pred and pred.predicted_speedup is not None:
            s += (f" (the formula predicted {pred.predicted_speedup:.2f}× from {pred.mean_acceptance_length:.2f} "
                  f"tokens a round, c={pred.c:.3f}, v({pred.k})={pred.v:.2f}; it would pick k={pred.predicted_best_k})")
        s += " — " + _advice(won, lost, overall)
        parts.append(s)
    return "\n\n".join(parts)


def _advice(won, lost, overall) -> str:
    if won and not lost:
        return f"leave speculation on ({overall.config if overall else won[0].config})."
    if not won:
        return ("speculation does not pay for this model on this machine: use --no-spec, or leave adaptive on "
                "so it can fall back to plain.")
    names = ", ".join(b.task for b in won)
    return f"it pays on {names} but not everywhere: leave adaptive on."
