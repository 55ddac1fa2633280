"""An answer's record and its one-line summary (pure: data in, data or words out; nothing here touches the engine).

`answer_record` is what is saved with each assistant message (`Stats.to_dict()` plus mode, drafter, k, finish and
the auto-off reason, named as `run --json` names them); `meta_line` turns a record, live or reloaded, into the
line under the answer; `stats_from_dict` rebuilds the `Stats` of a reloaded answer.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from ..engine.outcome import AUTO_OFF, PLAIN, SPEC
from ..engine.stats import Stats
from ..speculative.types import NO_DRAFTER
from .answer import AnswerStats


def answer_record(a: AnswerStats, *, drafter: str, accepted_spans: list[list[int]]) -> dict[str, Any]:
    """The finished answer `a` as saved with its message. `drafter`: the engine's; saved as "none" when the answer
    ran without it (speculation off)."""
    return a.stats.to_dict() | {
        "mode": a.mode, "drafter": drafter if a.controller is not None else NO_DRAFTER, "k": a.k,
        "finish": a.finish, "spec_disabled_reason": a.off_reason if a.mode == AUTO_OFF else None,
        "accepted_spans": accepted_spans}


def in_words(reason: str) -> str:
    """The words of a controller's reason, without the numbers that follow them ("lookup: it would be 20 %
    slower here — drafts accepted …" -> "lookup: it would be 20 % slower here"), one clause per source."""
    return "; ".join(part.split(" — ")[0] for part in reason.split("; "))


def how_decoded(d: Mapping[str, Any]) -> str:
    """"spec: lookup k=6", "auto-off: lookup: it would be 20 % slower here", "plain: lookup drafted nothing",
    or "plain": the same words the stats panel and `run` use."""
    mode = d.get("mode", PLAIN)
    if mode == SPEC:
        return f"spec: {d.get('drafter', NO_DRAFTER)} k={d.get('k', 0)}"
    if mode == AUTO_OFF:
        why = d.get("spec_disabled_reason")
        return f"auto-off: {in_words(why)}" if why else AUTO_OFF
    drafter = d.get("drafter", NO_DRAFTER)
    return f"plain: {drafter} drafted nothing" if drafter != NO_DRAFTER else PLAIN


def meta_line(d: Mapping[str, Any]) -> str:
    """An answer's stats in one line, from `answer_record` (live or reloaded)."""
    parts = [f"{d.get('n_generated', 0)} tok", f"{d.get('tokens_per_second', 0.0):.0f} tok/s",
             f"ttft {d.get('ttft_ms', 0.0):.0f} ms"]
    dn = d.get("draft_n", 0)
    if dn:
        acc = d.get("draft_n_accepted", 0)
        parts.append(f"accepted {acc}/{dn} ({100 * acc / dn:.0f}%)")
        parts.append(f"{d.get('mean_acceptance_length', 0.0):.2f} tok/pass")
    parts.append(how_decoded(d))
    if d.get("finish") not in (None, "stop"):
        parts.append(str(d["finish"]))
    return " · ".join(parts)


def stats_from_dict(d: Mapping[str, Any]) -> Stats:
    """Inverse of `Stats.to_dict()` (extra keys ignored): a reloaded message shows its stats again."""
    names = {f.name for f in fields(Stats)}
    kw = {k: v for k, v in d.items() if k in names}
    kw["drafted_at"] = tuple(kw.get("drafted_at", ()))
    kw["accepted_at"] = tuple(kw.get("accepted_at", ()))
    kw["by_source"] = {k: (v["draft_n"], v["draft_n_accepted"]) for k, v in (kw.get("by_source") or {}).items()}
    return Stats(**kw)
