"""The live stats panel: is the drafter earning its keep?

Shows the speculation setting (AUTO, AUTO-OFF when the adaptive controller has switched drafting off itself, ON,
OFF) and why, what the answer did (mode spec / plain / auto-off, as `run --json` names it), the draft length
(how it is chosen, the γ the controller would use now, the γ it chose most in the answer), tokens/s (latest batch
and the whole answer), acceptance (answer and session), mean acceptance length (tokens per target pass, vLLM's
definition), time to first token, the thread counts in use and why they last changed, and sparklines of tokens/s
and acceptance over recent rounds. The panel renders an `AnswerStats`, a `SpecStatus` and a `ThreadState`; it
never reads the engine, so scripted values drive it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from ..answer import HISTORY, AnswerStats
from ..controls import AUTO, OFF, SpecStatus

if TYPE_CHECKING:
    from ...tuning.threads import ThreadState


def pct(accepted: int, drafted: int) -> str:
    return f"{100 * accepted / drafted:.0f}% ({accepted}/{drafted})" if drafted else "–"


def setting_line(s: SpecStatus) -> str:
    return "speculation " + ("AUTO-OFF" if s.auto_off else s.setting.upper())


def reason_line(s: SpecStatus) -> str:
    """Why speculation is (not) drafting now, in the controller's words when it decided."""
    if s.choices == (OFF,):
        return "no drafter loaded (--no-spec); use --lookup or --draft"
    if s.setting == OFF:
        return "switched off: plain decoding (ctrl+s)"
    if s.auto_off:
        return f"off now: {s.off_reason}"
    if s.sources_off:  # a hybrid drafter: one source drafts, the controller stopped the other
        return f"{s.drafter}: drafting; off now: " + "; ".join(s.sources_off)
    if s.setting == AUTO:
        return f"{s.drafter}: the controller picks γ and switches drafting off when it does not pay"
    return f"{s.drafter}: always drafts {s.label} tokens a round"


def k_line(a: AnswerStats, s: SpecStatus) -> str:
    answer = f"answer {a.k or '–'}"
    if s.setting == OFF:
        return "k      – (speculation off)"
    if s.setting == AUTO:
        return f"k      {s.label} · now {s.k_now or 'off'} · {answer}"
    return f"k      {s.label} fixed · {answer}"


def threads_why(t: "ThreadState | None") -> str:
    """The latest thread-count change as `run` prints it ("target 2 -> 1: machine busy: …"), or why none."""
    if t is None:
        return "as llama.cpp loaded them"
    if t.changes:
        c = t.changes[-1]
        return f"{c.phase} {c.old} -> {c.new}: {c.reason}"
    return "pinned (--threads)" if t.pinned else "as calibrated at load"


def lines(a: AnswerStats, s: SpecStatus, t: "ThreadState | None" = None) -> dict[str, str]:
    """Label id -> text; a pure function so tests can check the words without a terminal."""
    st = a.stats
    return {
        "spec": setting_line(s),
        "reason": reason_line(s),
        "mode": f"mode   {a.mode or '–'} · drafter {s.drafter}",
        "k": k_line(a, s),
        "tps-now": f"tok/s  {a.tps_now:.1f} now",
        "tps-msg": f"       {st.tokens_per_second:.1f} message",
        "acc-msg": f"accept {pct(st.draft_n_accepted, st.draft_n)} msg",
        "acc-session": f"       {pct(a.session_accepted, a.session_draft_n)} session",
        "mal": f"len    {st.mean_acceptance_length:.2f} tok/pass" if st.rounds else "len    –",
        "ttft": f"ttft   {st.ttft_ms:.0f} ms" if st.rounds else "ttft   –",
        "tokens": f"tokens {st.n_generated} (prompt {st.n_prompt}, cached {st.n_cached})",
        "threads": t.line() if t else "threads –",
        "threads-why": threads_why(t),
    }


class StatsPanel(Vertical):
    """Right-hand panel; call `show(answer, status, threads)` (the app does so at most ~20 times a second)."""

    DEFAULT_CSS = """
    StatsPanel { width: 36; padding: 0 1; border-left: vkey $primary 30%; }
    StatsPanel Label { width: 100%; }
    StatsPanel #spec { text-style: bold; }
    StatsPanel.-on #spec { color: $success; }
    StatsPanel.-off #spec { color: $warning; }
    StatsPanel #reason { color: $text-muted; margin-bottom: 1; }
    StatsPanel #threads { margin-top: 1; }
    StatsPanel #threads-why { color: $text-muted; }
    StatsPanel .caption { margin-top: 1; color: $text-muted; }
    StatsPanel Sparkline { height: 3; }
    StatsPanel #acc-spark > .sparkline--max-color { color: $success; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.answer = AnswerStats()
        self.status = SpecStatus()
        self.threads: ThreadState | None = None

    def compose(self) -> ComposeResult:
        for key, text in lines(self.answer, self.status, self.threads).items():
            yield Label(text, id=key, markup=False)
        yield Label("tokens/s, recent rounds", classes="caption")
        yield Sparkline([], id="tps-spark")
        yield Label("acceptance, recent rounds", classes="caption")
        yield Sparkline([], id="acc-spark")

    def show(self, answer: AnswerStats, status: SpecStatus, threads: "ThreadState | None" = None) -> None:
        self.answer, self.status, self.threads = answer, status, threads
        if not self.is_mounted:
            return
        for key, text in lines(answer, status, threads).items():
            self.query_one(f"#{key}", Label).update(text)
        drafting = status.setting != OFF and not status.auto_off
        self.set_class(drafting, "-on")
        self.set_class(not drafting, "-off")
        self.query_one("#tps-spark", Sparkline).data = list(answer.tps_history[-HISTORY:])
        self.query_one("#acc-spark", Sparkline).data = list(answer.acc_history[-HISTORY:])

    def on_mount(self) -> None:
        self.show(self.answer, self.status, self.threads)

    def text(self) -> str:
        """Everything the panel says, one label a line (for tests and screen readers)."""
        return "\n".join(lines(self.answer, self.status, self.threads).values())
