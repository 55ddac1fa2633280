"""The live stats panel: is the drafter earning its keep?

Shows tokens/s (latest batch and the whole message), acceptance rate (message and session), mean acceptance
length (tokens per target pass, vLLM's definition), the draft length in use, drafter and mode, whether
speculation is on and why, time to first token, and sparklines of tokens/s and acceptance over recent rounds.
The panel renders a `StatsView`; it never reads the engine, so it can be driven with scripted stats.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from ...stats import Stats

HISTORY = 60  # points kept in each sparkline


@dataclass(frozen=True)
class StatsView:
    stats: Stats = Stats()  # the current (or last) message
    tps_now: float = 0.0  # tokens/s over the latest batch of rounds
    session_draft_n: int = 0  # over every message of this session, including the current one
    session_accepted: int = 0
    drafter: str = "none"
    mode: str = "plain"  # "spec" | "plain" in the latest round
    k: int = 0  # draft length the controller uses now
    k_used: int = 0  # draft length of the latest round
    k_mode: str = "fixed"  # "fixed" (pinned k) | "auto" (adaptive controller)
    spec_on: bool = False
    auto_off: bool = False  # on, but the adaptive controller decodes plainly for now (it still probes)
    spec_reason: str = ""  # why speculation is on/off: "lookup, k=4", "toggled off", "no drafter loaded", ...
    tps_history: tuple[float, ...] = ()
    acc_history: tuple[float, ...] = ()

    @property
    def session_rate(self) -> float | None:
        return self.session_accepted / self.session_draft_n if self.session_draft_n else None


def pct(accepted: int, drafted: int) -> str:
    return f"{100 * accepted / drafted:.0f}% ({accepted}/{drafted})" if drafted else "–"


def lines(v: StatsView) -> dict[str, str]:
    """Label id -> text; a pure function so tests can check the words without a terminal."""
    s = v.stats
    return {
        "spec": f"speculation {('AUTO-OFF' if v.auto_off else 'ON') if v.spec_on else 'OFF'}",
        "reason": v.spec_reason,
        "mode": f"mode   {v.mode} · drafter {v.drafter}",
        "k": f"k      {v.k} {v.k_mode} (last round {v.k_used})",
        "tps-now": f"tok/s  {v.tps_now:.1f} now",
        "tps-msg": f"       {s.tokens_per_second:.1f} message",
        "acc-msg": f"accept {pct(s.draft_n_accepted, s.draft_n)} msg",
        "acc-session": f"       {pct(v.session_accepted, v.session_draft_n)} session",
        "mal": f"len    {s.mean_acceptance_length:.2f} tok/pass" if s.rounds else "len    –",
        "ttft": f"ttft   {s.ttft_ms:.0f} ms" if s.rounds else "ttft   –",
        "tokens": f"tokens {s.n_generated} (prompt {s.n_prompt}, cached {s.n_cached})",
    }


class StatsPanel(Vertical):
    """Right-hand panel; call `show(view)` (the app does so at most ~20 times a second)."""

    DEFAULT_CSS = """
    StatsPanel { width: 36; padding: 0 1; border-left: vkey $primary 30%; }
    StatsPanel Label { width: 100%; }
    StatsPanel #spec { text-style: bold; }
    StatsPanel.-on #spec { color: $success; }
    StatsPanel.-off #spec { color: $warning; }
    StatsPanel #reason { color: $text-muted; margin-bottom: 1; }
    StatsPanel .caption { margin-top: 1; color: $text-muted; }
    StatsPanel Sparkline { height: 3; }
    StatsPanel #acc-spark > .sparkline--max-color { color: $success; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = StatsView()

    def compose(self) -> ComposeResult:
        for key, text in lines(self.view).items():
            yield Label(text, id=key, markup=False)
        yield Label("tokens/s, recent rounds", classes="caption")
        yield Sparkline([], id="tps-spark")
        yield Label("acceptance, recent rounds", classes="caption")
        yield Sparkline([], id="acc-spark")

    def show(self, view: StatsView) -> None:
        self.view = view
        if not self.is_mounted:
            return
        for key, text in lines(view).items():
            self.query_one(f"#{key}", Label).update(text)
        self.set_class(view.spec_on and not view.auto_off, "-on")
        self.set_class(not view.spec_on or view.auto_off, "-off")
        self.query_one("#tps-spark", Sparkline).data = list(view.tps_history[-HISTORY:])
        self.query_one("#acc-spark", Sparkline).data = list(view.acc_history[-HISTORY:])

    def on_mount(self) -> None:
        self.show(self.view)

    def text(self) -> str:
        """Everything the panel says, one label a line (for tests and screen readers)."""
        return "\n".join(lines(self.view).values())
