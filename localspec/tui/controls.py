"""The one place the chat changes the engine: the speculation setting and the draft length.

Three settings, cycled with ctrl+s and named the same in the footer, the stats panel and the command palette:

    auto  the session's adaptive controller picks γ each round and may switch drafting off when it does not pay
    on    speculation forced on: a `FixedK` at the chosen γ (ctrl+k changes it; a running answer follows next round)
    off   plain decoding: answers run without the drafter (the controllers keep what they learned)

"auto" exists when the engine was loaded with an adaptive controller, "on" and "off" when it has a drafter.
A setting takes effect from the next answer; only γ under "on" changes mid-answer. Everything else in the TUI
reads the controller through `ControllerState` snapshots and never changes the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..speculative.types import NO_DRAFTER, ControllerState
from ..tuning.fixed import FixedK
from ..tuning.sources import DEFAULT_K

if TYPE_CHECKING:
    from ..engine.engine import Engine

AUTO, ON, OFF = "auto", "on", "off"
K_STEPS = (1, 2, 3, 4, 6, 8)  # what ctrl+k cycles through (then back to auto, where the session has it)
NO_DRAFTER_HINT = "no drafter loaded: start with --lookup or --draft MODEL"


@dataclass(frozen=True)
class SpecStatus:
    """The setting and what the controller does with it now, for the stats panel and the footer."""

    setting: str = OFF  # AUTO | ON | OFF
    choices: tuple[str, ...] = (OFF,)  # the settings this session offers, in ctrl+s order
    drafter: str = NO_DRAFTER
    label: str = "–"  # how γ is chosen: "auto", or the pinned γ ("4"); "–" while off
    k_now: int = 0  # γ the controller would draft next round (0: it decodes plainly)
    off_reason: str | None = None  # the controller's words while it has switched drafting off itself
    sources_off: tuple[str, ...] = ()  # while some source still drafts: the controller's words for those it stopped

    @property
    def auto_off(self) -> bool:
        """"auto", but the adaptive controller decodes plainly for now (it still probes now and then)."""
        return self.setting == AUTO and self.off_reason is not None


class SpecControls:
    """Owns the speculation setting of one chat session and applies it to the engine."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        loaded = engine.controller
        self.fixed: FixedK | None = loaded if isinstance(loaded, FixedK) else None  # the "on" controller
        self.adaptive = None if self.fixed is not None or engine.drafter is None else loaded  # the "auto" one
        # read once, here: later reads of the adaptive controller happen on the worker (it owns it while running)
        self.auto_label = self.adaptive.state().label if self.adaptive is not None else AUTO
        self.setting = OFF if engine.drafter is None else AUTO if self.adaptive is not None else ON

    @property
    def choices(self) -> tuple[str, ...]:
        if self.engine.drafter is None:
            return (OFF,)
        return (AUTO, ON, OFF) if self.adaptive is not None else (ON, OFF)

    @property
    def drafting(self) -> bool:
        """Whether the next answer runs with the drafter (`Engine.generate(speculate=...)`)."""
        return self.setting != OFF

    @property
    def k_pinned(self) -> int | None:
        """γ under "on" (None until "on" was first chosen in an adaptive session)."""
        return self.fixed.k if self.fixed is not None else None

    def next_setting(self) -> str:
        c = self.choices
        return c[(c.index(self.setting) + 1) % len(c)] if self.setting in c else c[0]

    def cycle(self, state: ControllerState | None = None) -> str:
        """ctrl+s: auto -> on -> off -> auto (on <-> off without an adaptive controller). Returns the notice."""
        return self.set(self.next_setting(), state)

    def set(self, setting: str, state: ControllerState | None = None) -> str:
        """Apply a setting. `state`: the controller's latest snapshot, whose γ "on" starts from."""
        if self.engine.drafter is None:
            return NO_DRAFTER_HINT
        if setting not in self.choices:
            return "speculation auto needs the adaptive controller (start without --no-adaptive)"
        self.setting = setting
        if setting == AUTO and self.adaptive is not None:  # AUTO is a choice only with one
            self.engine.controller = self.adaptive
            return "speculation auto: the controller picks γ and switches drafting off when it does not pay"
        if setting == ON:
            fixed = self.engine.controller = self._fixed(self._start_k(state))
            return f"speculation on: always draft k = {fixed.k}"
        return "speculation off: plain decoding"

    def set_k(self, k: int) -> str:
        """Draft k tokens a round, always: the setting becomes "on" (live: a running "on" answer follows)."""
        if self.engine.drafter is None:
            return NO_DRAFTER_HINT
        if k < 1:
            return "k must be at least 1; ctrl+s switches speculation off"
        self.setting = ON
        fixed = self.engine.controller = self._fixed(k)
        fixed.k = k
        return f"speculation on: draft length k = {k}"

    def cycle_k(self) -> str:
        """ctrl+k: auto -> 1 -> 2 -> ... -> 8 -> auto (or back to 1 without an adaptive controller)."""
        now = 0 if self.setting == AUTO else (self.k_pinned or 0)
        nxt = next((s for s in K_STEPS if s > now), None)
        if nxt is None and self.adaptive is not None:
            return self.set(AUTO)
        return self.set_k(nxt or K_STEPS[0])

    def _fixed(self, k: int) -> FixedK:
        if self.fixed is None:
            self.fixed = FixedK(k)
        return self.fixed

    def _start_k(self, state: ControllerState | None) -> int:
        """γ for "on": the one pinned before, else the adaptive controller's γ now or its most chosen one."""
        if self.fixed is not None:
            return self.fixed.k
        return (state.k_now or state.k_mode or DEFAULT_K) if state else DEFAULT_K

    def snapshot(self) -> ControllerState | None:
        """The controller's state now. Call only while no answer runs (the worker owns the controller then)."""
        return self.engine.controller.state() if self.engine.drafter is not None else None

    def status(self, state: ControllerState | None) -> SpecStatus:
        """The setting, with `state` (the worker's latest snapshot, or `snapshot()` between answers)."""
        drafter = self.engine.drafter_name if self.engine.drafter is not None else NO_DRAFTER
        if self.setting == OFF:
            return SpecStatus(OFF, self.choices, drafter)
        label = self.auto_label if self.setting == AUTO else str(self.k_pinned)
        if state is None:
            return SpecStatus(self.setting, self.choices, drafter, label)
        why = state.spec_disabled_reason
        return SpecStatus(self.setting, self.choices, drafter, label, state.k_now, why,
                          () if why else tuple(state.off.values()))
