"""Engine chunks -> batched UI updates, on the worker thread (no Textual imports here).

A verify round can emit several tokens and rounds come faster than a terminal should repaint, so the worker
folds rounds into one `Update` at most every `interval` seconds (50 ms -> <= 20 repaints/s). The first round
and the last round always go out at once: time to first token and the final stats are never delayed.

An `Update` splits its text into segments marked `accepted=True` where the text came from drafts the target
accepted (`step.tokens[:step.accepted]`): the UI colours those so a person sees where the drafter was right.
It also carries snapshots of the draft-length controller and the thread controller, taken here, on the worker
that owns them, so the UI never reads a controller while the loop updates it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

from ..engine.outcome import request_mode
from ..engine.stats import Stats
from ..sampling.params import SamplingParams
from ..speculative.types import NO_DRAFTER

if TYPE_CHECKING:
    from ..engine.engine import Chunk, Engine
    from ..engine.metrics import MetricsLog
    from ..speculative.types import ControllerState
    from ..tuning.threads import ThreadState

INTERVAL = 0.05  # seconds between UI updates: <= 20 repaints per second


@dataclass(frozen=True)
class Segment:
    text: str
    accepted: bool  # emitted from an accepted draft (not the target's own token)


@dataclass(frozen=True)
class Update:
    segments: tuple[Segment, ...]
    stats: Stats  # running totals for the request
    mode: str  # "spec" | "plain" in the latest round
    k_used: int  # draft length of the latest round (0 = plain round)
    tps_now: float  # tokens/s over the rounds in this update
    acceptance: tuple[float, ...]  # accepted/drafted of each speculative round in this update
    finish: str | None = None  # "stop", "length", "context", "cancelled"; None while going
    controller: "ControllerState | None" = None  # after these rounds; None when the request runs without a drafter
    k_chosen: Mapping[int, int] = field(default_factory=dict)  # the request's rounds so far by the γ chosen
    threads: "ThreadState | None" = None  # thread counts in use and their changes; None: counts as loaded

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)


def split_accepted(text: str, accepted_text: str) -> int:
    """How many leading characters of a chunk's `text` came from accepted drafts.

    The chunk text can differ from the raw pieces (partial UTF-8 held back, stop strings), so when the
    accepted text is not a prefix we fall back to its length, clipped: colouring is display-only."""
    if not accepted_text:
        return 0
    if text.startswith(accepted_text):
        return len(accepted_text)
    return min(len(accepted_text), len(text))


def accepted_spans(segments: Sequence[Segment]) -> list[list[int]]:
    """[start, end) character ranges of accepted-draft text: saved with a message so a reload keeps colours."""
    out, pos = [], 0
    for seg in segments:
        if seg.accepted:
            out.append([pos, pos + len(seg.text)])
        pos += len(seg.text)
    return out


def from_spans(text: str, spans: Sequence[Sequence[int]]) -> tuple[Segment, ...]:
    out, pos = [], 0
    for start, end in spans:
        if start > pos:
            out.append(Segment(text[pos:start], False))
        out.append(Segment(text[start:end], True))
        pos = end
    if pos < len(text):
        out.append(Segment(text[pos:], False))
    return tuple(s for s in out if s.text)


class Batcher:
    """Accumulates chunks; `take()` returns one Update for everything since the last take."""

    def __init__(self, *, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last = float("-inf")
        self._reset()

    def _reset(self) -> None:
        self._segments: list[Segment] = []
        self._acceptance: list[float] = []
        self._tokens = 0
        self._seconds = 0.0

    def add(self, chunk: "Chunk", accepted_text: str) -> None:
        step = chunk.step
        n = split_accepted(chunk.text, accepted_text)
        self._push(Segment(chunk.text[:n], True))
        self._push(Segment(chunk.text[n:], False))
        self._tokens += len(step.tokens)
        self._seconds += step.t_draft + step.t_verify
        if step.drafted:
            self._acceptance.append(step.accepted / step.drafted)
        self._chunk = chunk

    def _push(self, seg: Segment) -> None:
        if not seg.text:
            return
        if self._segments and self._segments[-1].accepted == seg.accepted:
            seg = Segment(self._segments.pop().text + seg.text, seg.accepted)
        self._segments.append(seg)

    def due(self) -> bool:
        return self.clock() - self._last >= self.interval

    def take(self, *, controller: "ControllerState | None" = None, k_chosen: Mapping[int, int] = {},
             threads: "ThreadState | None" = None) -> Update:
        c = self._chunk
        upd = Update(tuple(self._segments), c.stats, c.mode, c.step.drafted,
                     self._tokens / self._seconds if self._seconds > 0 else 0.0, tuple(self._acceptance), c.finish,
                     controller, dict(k_chosen), threads)
        self._last = self.clock()
        self._reset()
        return upd


def stream_updates(engine: "Engine", prompt: str, *, params: SamplingParams = SamplingParams(),
                   max_tokens: int = 512, speculate: bool = True, should_stop: Callable[[], bool] | None = None,
                   metrics_log: "MetricsLog | None" = None, task: str | None = None,
                   interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic) -> Iterator[Update]:
    """Run one request on the calling thread; yield batched Updates, the last one with `finish` set; then, with
    `metrics_log`, append the request's line (named as the chat labels the answer). The controller is taken
    once, here: one the UI installs meanwhile applies from the next request."""
    batcher = Batcher(interval=interval, clock=clock)
    piece = engine.target.piece
    ctl, threads = engine.controller, engine.threads
    drafting = speculate and engine.drafter is not None
    before = ctl.state() if drafting else None
    threads_before = threads.state() if threads else None
    upd = None
    for chunk in engine.generate(prompt, params=params, max_tokens=max_tokens, speculate=speculate, controller=ctl,
                                 should_stop=should_stop):
        accepted = b"".join(piece(t) for t in chunk.step.tokens[:chunk.step.accepted])
        batcher.add(chunk, accepted.decode("utf-8", errors="ignore"))
        if chunk.finish or batcher.due():
            now = ctl.state() if before is not None else None
            upd = batcher.take(controller=now, k_chosen=now.since(before).k_chosen if now else {},
                               threads=threads.state() if threads else None)
            yield upd
    if metrics_log is not None and upd is not None:
        from ..engine.metrics import request_record

        metrics_log.write(request_record(
            model=engine.name, drafter=engine.drafter_name if drafting else NO_DRAFTER,
            mode=request_mode(upd.stats.draft_n, upd.stats.rounds, drafting=drafting, k_chosen=upd.k_chosen),
            stats=upd.stats,
            finish=upd.finish, task=task, controller=upd.controller, before=before, threads=upd.threads,
            threads_before=threads_before, front_end="chat"))
