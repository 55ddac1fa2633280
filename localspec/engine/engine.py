"""The text layer over the speculative loop: what every front end (CLI, TUI, server, bench) consumes.

`Engine.generate()` turns a prompt (text or tokens) into a stream of `Chunk`s: new text (incremental UTF-8,
stop strings held back until they can no longer match), the round's `Step`, and a stats snapshot.
Prompt-prefix KV reuse across requests is automatic: prefill and the model drafter keep the longest
common prefix of what their caches already hold.

Threading: one thread owns an Engine at a time (llama contexts are not thread-safe).
"""

from __future__ import annotations

import codecs
import time
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any, Callable, Generator, Sequence

from ..backend import Model
from ..sampling.params import SamplingParams
from ..speculative.loop import Progress, generate
from ..speculative.types import NO_DRAFTER, Controller, ControllerState, Drafter, Step
from ..tuning.acceptance import AcceptanceStore
from ..tuning.controller import Adaptive
from ..tuning.fixed import FixedK
from ..tuning.sources import DEFAULT_K
from ..tuning.threads import ThreadControl
from .chatplan import ChatPlan
from .outcome import Outcome, outcome
from .stats import Stats, StatsCounter
from .template import ChatTemplateError, render_chat


@dataclass(frozen=True)
class Chunk:
    text: str  # new text since the previous chunk (may be empty while a stop string is pending)
    step: Step
    stats: Stats  # running totals for this request
    finish: str | None = None  # "stop" (EOG or stop string), "length", "context"; None while going
    mode: str = "plain"  # "spec" or "plain" for this round
    outcome: Outcome | None = None  # on the last chunk: what speculation did in the whole request


class TextStream:
    """Token bytes -> text, holding back partial UTF-8 and anything that may still become a stop string."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in stop if s]
        self._held = ""

    def push(self, data: bytes) -> tuple[str, bool]:
        """Feed bytes; return (text safe to release, hit_stop)."""
        if not self.stop:  # nothing can be held back but partial UTF-8, which the decoder keeps
            return self._dec.decode(data), False
        buf = self._held + self._dec.decode(data)
        for s in self.stop:
            i = buf.find(s)
            if i >= 0:
                return self._release(buf[:i], ""), True
        keep = max((self._pending_len(buf, s) for s in self.stop), default=0)
        return self._release(buf[:len(buf) - keep], buf[len(buf) - keep:]), False

    def flush(self) -> str:
        return self._release(self._held + self._dec.decode(b"", final=True), "")

    def _release(self, out: str, held: str) -> str:
        self._held = held
        return out

    @staticmethod
    def _pending_len(buf: str, stop: str) -> int:
        """Longest suffix of buf that is a proper prefix of stop."""
        for n in range(min(len(stop) - 1, len(buf)), 0, -1):
            if buf.endswith(stop[:n]):
                return n
        return 0


class Engine:
    """A loaded target, an optional drafter, and the per-session controller: the one owner of how much to
    draft (`controller.state()` says what it chose; nothing else here stores a draft length)."""

    def __init__(self, target: Model, drafter: Drafter | None = None, *, controller: Controller | None = None,
                 name: str = "", drafter_name: str = "", chat_template: str | None = None,
                 threads: ThreadControl | None = None, acceptance: AcceptanceStore | None = None) -> None:
        self.target = target
        self.acceptance = acceptance  # where the controller's measured acceptance is kept for the next run
        self.threads = threads  # the thread controller (threads.py); None: llama.cpp's counts as loaded
        self.drafter = drafter
        self.controller: Controller = controller or FixedK(DEFAULT_K if drafter else 0)
        self.name = name or target.path.name
        self.drafter_name = drafter_name or (drafter.name if drafter else NO_DRAFTER)
        self._meta = target.metadata()
        self._chat_template = chat_template  # models.toml override; else the GGUF's own
        self.thinking = True  # the template's enable_thinking unless a request says (serve --reasoning off: False)

    def close(self) -> None:
        self.keep_acceptance(self.controller, force=True)
        if self.drafter:
            self.drafter.close()
        self.target.close()

    def memory(self) -> dict[str, dict]:
        """Each model's memory kind, how a rejected draft is rewound on it, and what rewinding has cost so far
        (checkpoints saved and restored, tokens decoded again; backend/rollback.py)."""
        models = {"target": self.target, "drafter": _draft_model(self.drafter)}
        return {role: {"kind": m.rollback_info.kind, "rollback": m.rollback_info.method,
                       "rs_depth": m.rollback_info.rs_depth, **m.rollback_counts}
                for role, m in models.items() if m is not None}

    def keep_acceptance(self, ctl: Controller, *, force: bool = False) -> None:
        """Write what an adaptive controller's rounds measured of the drafter's acceptance (acceptance.py), so the
        next run of this pair starts from it: after each generation (at most every few seconds) and at close."""
        if self.acceptance is not None and isinstance(ctl, Adaptive):
            self.acceptance.save(ctl.measurements(), force=force)

    @property
    def chat_template(self) -> str | None:
        return self._chat_template or self._meta.get("tokenizer.chat_template")

    @chat_template.setter
    def chat_template(self, text: str | None) -> None:
        """`serve --chat-template-file`: a template that wins over models.toml's and the GGUF's."""
        self._chat_template = text

    @property
    def metadata(self) -> dict[str, str]:
        return self._meta

    def chat_prompt(self, messages: Sequence[dict], **context: Any) -> str:
        tpl = self.chat_template
        if not tpl:
            raise ChatTemplateError(f"{self.name} has no chat template in its GGUF metadata; "
                                    "use a plain prompt (no --chat) or an instruct model")
        t = self.target
        context = {"enable_thinking": self.thinking, **context}
        return render_chat(tpl, messages, bos=t.token_text(t.bos) if t.bos >= 0 else "",
                           eos=t.token_text(t.eos) if t.eos >= 0 else "", **context)

    def render(self, plan: ChatPlan) -> str:
        """A chat request's prompt text: its plan's messages through the chat template, then the prefill. The
        request's own template variables win over the plan's generation prompt, as render_chat lets them."""
        context = {"add_generation_prompt": plan.add_generation_prompt, **plan.context}
        return self.chat_prompt(plan.messages, **context) + plan.prefill

    def system_tokens(self, plan: ChatPlan, tokens: Sequence[int]) -> int:
        """How many of `tokens` (the plan's prompt) belong to its leading system messages: what a context shift
        keeps (llama-server's "drop the oldest tokens after the system prompt"). 0 without a system message, or
        when the template cannot render the system messages alone (Llama 3.1 puts tools in the first user turn)."""
        head = plan.system_head()
        if head is None:
            return 0
        try:
            ids = self.tokenize(self.render(head))
        except ChatTemplateError:
            return 0
        return next((i for i, (a, b) in enumerate(zip(ids, tokens)) if a != b), min(len(ids), len(tokens)))

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Prompt text -> tokens, BOS added per the GGUF, special-token text parsed (chat templates use it)."""
        toks = self.target.tokenize(text, add_special=True, parse_special=special)
        bos = self.target.bos
        if len(toks) >= 2 and toks[0] == bos and toks[1] == bos:  # template already wrote BOS
            toks = toks[1:]
        return toks

    def generate(self, prompt: str | Sequence[int], *, params: SamplingParams = SamplingParams(),
                 max_tokens: int = 256, stop: Sequence[str] = (), speculate: bool = True,
                 controller: Controller | None = None, should_stop: Callable[[], bool] | None = None,
                 context_shift: bool = False, n_keep: int = 0,
                 progress: Progress | None = None) -> Generator[Chunk, None, None]:
        """Stream a completion. Closing the iterator early (or `should_stop()` turning true) ends generation
        after the current round; caches stay consistent either way. `context_shift`: a full context drops old
        tokens and goes on (`_shifting`), keeping the first `n_keep` (-1: the whole prompt). `progress` hears
        the prompt tokens evaluated so far, once for the reused prefix and once a batch (loop.prefill)."""
        t_start = time.perf_counter()
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        drafter = self.drafter if speculate else None
        counter = StatsCounter(t_start)
        text = TextStream(stop)
        ctl = controller or self.controller
        before = ctl.state() if drafter else None
        batch = self.target.options.n_batch if progress is not None else 0
        if context_shift:
            steps = self._shifting(tokens, drafter, ctl, params, max_tokens, n_keep, progress, batch)
        else:
            steps = generate(self.target, tokens, drafter=drafter, controller=ctl, params=params,
                             max_tokens=max_tokens, progress=progress, batch=batch)
        if self.threads is not None:
            steps = self.threads.follow(steps)  # thread counts chosen between rounds
        try:
            yield from self._chunks(steps, counter, text, ctl, before, should_stop)
        finally:
            self.keep_acceptance(ctl)

    def _chunks(self, steps: Generator[Step, None, None], counter: StatsCounter, text: TextStream, ctl: Controller,
                before: ControllerState | None, should_stop: Callable[[], bool] | None) -> Generator[Chunk, None, None]:
        """The loop's steps as chunks of text with their statistics, up to the step that finishes."""
        drafter = before is not None
        with closing(steps):  # run the loop's finally (KV rollback) now, not at garbage collection
            for step in steps:
                counter.add(step)
                out, hit = text.push(b"".join(self.target.piece(t) for t in step.tokens))
                finish = "stop" if hit else step.finish
                if finish and not hit:
                    out += text.flush()
                if not finish and should_stop and should_stop():
                    finish = "cancelled"
                stats = counter.snapshot()
                done = outcome(before, ctl.state() if drafter else None, draft_n=stats.draft_n,
                               rounds=stats.rounds) if finish else None
                yield Chunk(out, step, stats, finish, "spec" if step.drafted else "plain", done)
                if finish:
                    return

    def _shifting(self, prompt: list[int], drafter: Drafter | None, ctl: Controller, params: SamplingParams,
                  max_tokens: int, n_keep: int, progress: Progress | None = None,
                  batch: int = 0) -> Generator[Step, None, None]:
        """llama-server's --context-shift: when the context fills, keep its first n_keep tokens (BOS at least),
        drop the older half of the rest, and go on. Each segment is an ordinary `generate` (its prefill reuses
        the kept head from the cache and evaluates the kept tail again), so the loop's KV invariant and the
        drafter's common-prefix re-sync hold across a shift; one random stream runs through all segments."""
        rng = params.rng()
        context = list(prompt)
        keep = len(prompt) if n_keep < 0 else max(n_keep, 1 if prompt[0] == self.target.bos else 0)
        left = max_tokens
        while True:
            with closing(generate(self.target, context, drafter=drafter, controller=ctl, params=params,
                                  max_tokens=left, rng=rng, progress=progress, batch=batch)) as steps:
                progress = None  # a shift's prefill is not the prompt's
                for step in steps:
                    context.extend(step.tokens)
                    left -= len(step.tokens)
                    shift = step.finish == "context" and left > 0
                    yield replace(step, finish=None) if shift else step
                    if step.finish and not shift:
                        return
                    if shift:
                        break
                else:
                    return
            head = min(keep, len(context) // 2)
            drop = max(1, (len(context) - head) // 2)
            context = context[:head] + context[head + drop:]


def _draft_model(drafter: object) -> Model | None:
    """The drafter's own model, if it has one: a model drafter's, alone or inside a hybrid or structure drafter."""
    d = drafter
    for _ in range(3):
        d = getattr(d, "model", None) or getattr(d, "fallback", None)
        if d is None or isinstance(d, Model):
            return d
    return None
