"""Small pure helpers the app uses to describe the engine's state in words (kept out of app.py to test alone)."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..controller import FixedK
from ..stats import Stats

if TYPE_CHECKING:
    from ..session import Engine

K_STEPS = (1, 2, 3, 4, 6, 8)  # what "change k" cycles through (then back to the adaptive controller, if any)
AUTO = 0  # "k = auto": hand γ back to the adaptive controller


def is_adaptive(controller: object) -> bool:
    return not isinstance(controller, FixedK) and controller is not None


def current_k(engine: "Engine") -> int:
    """The draft length in use now (0 = off), as the controller reports it. Read from the UI thread while the
    worker updates the controller: a torn read gives 0 (the next repaint reads again)."""
    try:
        return engine.controller.state().k_now
    except Exception:
        return 0


def next_k(k: int, *, auto: bool) -> int:
    """The next choice after k (AUTO = adaptive): auto -> 1 -> 2 -> ... -> 8 -> auto (or back to 1)."""
    nxt = next((s for s in K_STEPS if s > k), None) if k != AUTO else K_STEPS[0]
    return nxt if nxt is not None else (AUTO if auto else K_STEPS[0])


def set_draft_length(engine: "Engine", k: int, adaptive: object | None) -> str:
    """Pin γ = k with a FixedK (live: a running answer with a FixedK picks it up next round), or hand γ back
    to the session's adaptive controller (k = AUTO). The controller is the only thing changed; no reload."""
    if k == AUTO:
        if adaptive is None:
            return "no adaptive controller in this session; pick a number"
        engine.controller = adaptive
        return "draft length: adaptive (the controller picks γ each round)"
    if isinstance(engine.controller, FixedK):
        engine.controller.k = k
    else:
        engine.controller = FixedK(k)
    return f"draft length k = {k}"


def auto_off_reason(controller: object) -> str | None:
    """An adaptive controller's reason for decoding plainly now, if any. Read from the UI thread while the
    worker updates the controller: a torn read is skipped (the next repaint, 50 ms later, reads again)."""
    try:
        why = getattr(controller, "spec_disabled_reason", None)
    except Exception:
        return None
    return why if isinstance(why, str) and why else None


def spec_reason(engine: "Engine", spec_on: bool, *, last_mode: str, rounds: int) -> str:
    if engine.drafter is None:
        return "no drafter loaded (--no-spec); use --lookup or --draft"
    if not spec_on:
        return "switched off (ctrl+s to switch on)"
    why = auto_off_reason(engine.controller)
    if why:
        return f"auto-off: {why}"
    k = current_k(engine)
    if k == 0:
        return f"{engine.drafter_name}: the controller chose plain decoding"
    tail = " (last round: no draft)" if rounds and last_mode == "plain" else ""
    return f"{engine.drafter_name}, k={k}{tail}"


def meta_line(d: dict[str, Any]) -> str:
    """An answer's stats in one line, from `Stats.to_dict()` plus mode/drafter/k/finish (live or reloaded)."""
    parts = [f"{d.get('n_generated', 0)} tok", f"{d.get('tokens_per_second', 0.0):.0f} tok/s",
             f"ttft {d.get('ttft_ms', 0.0):.0f} ms"]
    dn = d.get("draft_n", 0)
    if dn:
        acc = d.get("draft_n_accepted", 0)
        parts.append(f"accepted {acc}/{dn} ({100 * acc / dn:.0f}%)")
        parts.append(f"{d.get('mean_acceptance_length', 0.0):.2f} tok/pass")
    mode = d.get("mode", "plain")
    parts.append(f"{mode}: {d.get('drafter', 'none')} k={d.get('k', 0)}" if mode == "spec" else "plain")
    if d.get("finish") not in (None, "stop"):
        parts.append(str(d["finish"]))
    return " · ".join(parts)


def stats_from_dict(d: dict[str, Any]) -> Stats:
    """Inverse of `Stats.to_dict()` (extra keys ignored): a reloaded message shows its stats again."""
    names = {f.name for f in fields(Stats)}
    kw = {k: v for k, v in d.items() if k in names}
    kw["drafted_at"] = tuple(kw.get("drafted_at", ()))
    kw["accepted_at"] = tuple(kw.get("accepted_at", ()))
    kw["by_source"] = {k: (v["draft_n"], v["draft_n_accepted"]) for k, v in (kw.get("by_source") or {}).items()}
    return Stats(**kw)
