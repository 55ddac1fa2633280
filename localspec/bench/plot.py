"""The bench plot (matplotlib, Agg: no display needed): one row per (target, drafter, temperature).

Left: measured speedup vs k, one line per task, with the formula's prediction (all tasks) dashed and the
break-even line at 1. Right: acceptance rate per draft position, one line per task, at the largest k.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .runner import PLAIN
from .summary import ALL, Row


def _families(rows: Sequence[Row]) -> list[tuple[str, str, float]]:
    return list(dict.fromkeys((r.target, r.drafter, r.temp) for r in rows
                              if r.drafter != PLAIN and isinstance(r.k, int)))


def write_png(rows: Sequence[Row], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = _families(rows)
    n = max(len(fams), 1)
    fig, axes = plt.subplots(n, 2, figsize=(11, 3.4 * n), squeeze=False)
    for (target, drafter, temp), (ax_s, ax_a) in zip(fams, axes):
        mine = [r for r in rows if (r.target, r.drafter, r.temp) == (target, drafter, temp) and isinstance(r.k, int)]
        tasks = list(dict.fromkeys(r.task for r in mine))
        for task in tasks:
            pts = sorted((r.k, r.speedup) for r in mine if r.task == task)
            style = dict(lw=2.5, color="black") if task == ALL else dict(lw=1.2, alpha=0.8)
            ax_s.plot(*zip(*pts), marker="o", label=task, **style)
        pred = sorted((r.k, r.predicted_speedup) for r in mine if r.task == ALL and r.predicted_speedup is not None)
        if pred:
            ax_s.plot(*zip(*pred), ls="--", color="gray", label="predicted (all)")
        ax_s.axhline(1.0, color="red", lw=0.8, ls=":")
        ax_s.set(title=f"{target} · {drafter} · T={temp:g}", xlabel="k (draft length γ)", ylabel="speedup vs plain")
        ax_s.set_xticks(sorted({r.k for r in mine}))
        ax_s.legend(fontsize=7, ncol=2)
        k_max = max(r.k for r in mine)
        for task in tasks:
            r = next(r for r in mine if r.task == task and r.k == k_max)
            if r.acceptance_per_position:
                style = dict(lw=2.5, color="black") if task == ALL else dict(lw=1.2, alpha=0.8)
                ax_a.plot(range(1, len(r.acceptance_per_position) + 1), r.acceptance_per_position, marker=".",
                          label=task, **style)
        ax_a.set(title=f"acceptance per position (k={k_max})", xlabel="draft position", ylabel="accepted",
                 ylim=(0, 1.02))
        ax_a.legend(fontsize=7, ncol=2)
    if not fams:
        axes[0][0].text(0.5, 0.5, "no speculative configurations", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
