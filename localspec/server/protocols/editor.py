"""llama-server's editor rules for `/completion` and `/infill` (llama.vim, llama.vscode): `n_indent` and
`t_max_predict_ms`, evaluated once per chunk by one `EditorRules` per choice.

When a rule is set, the worker evaluates it (`Job.until`, before it sends the chunk), so generation stops at the
cut rather than a round later while the next keystroke's request waits; the event loop then reads the verdict
the worker recorded. Without a rule there is nothing to cut and the event loop maps each chunk's finish to
llama-server's `stop_type` itself. Either way each chunk is judged once, on one thread.
"""

from __future__ import annotations

from collections import deque
from typing import AsyncIterator, Callable

from ...engine.engine import Chunk
from ..execution.run import Run
from ..request.fim import indent_cut
from ..request.schemas import CompletionRequest

Verdict = tuple[str, str]  # (this round's text to send, stop_type); stop_type "none" goes on


class EditorRules:
    """llama-server's editor rules, round by round: `n_indent` ends the completion at a line indented less than
    the cursor; `t_max_predict_ms`, once generation has run that long, ends it at the next newline generated
    (kept: a suggestion ends with whole lines), as llama-server checks it token by token. A round's tokens
    arrive together, so a round over budget is cut after its first newline."""

    def __init__(self, req: CompletionRequest) -> None:
        self.n_indent = req.n_indent
        self.budget = req.t_max_predict_ms or 0.0
        self.text = ""
        self._verdicts: deque[Verdict] = deque()  # the worker's, in chunk order, until the event loop reads them

    @property
    def active(self) -> bool:
        """A rule can cut the text (else the worker need not check anything)."""
        return self.n_indent > 0 or self.budget > 0

    def push(self, ch: Chunk) -> Verdict:
        new = self.text + ch.text
        cut = indent_cut(new, self.n_indent)
        if cut is not None:
            return new[len(self.text):cut] if cut > len(self.text) else "", "limit"
        self.text = new
        nl = ch.text.find("\n")
        if self.budget > 0 and ch.stats.gen_ms > self.budget and nl >= 0:  # llama-server: "only upon a new line"
            self.text = new[:len(new) - len(ch.text) + nl + 1]
            return ch.text[:nl + 1], "limit"
        if ch.finish:
            return ch.text, ("eos" if ch.step.finish == "stop" else "word") if ch.finish == "stop" else "limit"
        return ch.text, "none"

    def ends(self, ch: Chunk) -> bool:
        """`Job.until`, on the worker: judge the chunk and keep the verdict for the event loop."""
        verdict = self.push(ch)
        self._verdicts.append(verdict)
        return verdict[1] != "none"

    def verdict(self, ch: Chunk) -> Verdict:
        """On the event loop: the worker's verdict on this chunk when it judged it, else judged here."""
        return self._verdicts.popleft() if self.active else self.push(ch)

    @property
    def until(self) -> Callable[[Chunk], bool] | None:
        """What the job's `until` is: the rules on the worker when one is set."""
        return self.ends if self.active else None


async def policed(run: Run, rules: EditorRules) -> AsyncIterator[tuple[str, str, Chunk]]:
    """(text, stop_type, chunk) per round, with the editor rules applied."""
    async for ch in run.chunks():
        piece, stop_type = rules.verdict(ch)
        yield piece, stop_type, ch
        if stop_type != "none":
            return
