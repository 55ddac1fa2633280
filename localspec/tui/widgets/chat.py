"""The conversation: its messages, the log that shows them, and the answer being written.

`Chat` owns the chat history (what the next prompt is rendered from), the saved conversation it writes to, and
streaming: each answer is generated in a thread worker that iterates `stream.stream_updates` and posts Messages
back to this widget; the UI thread never calls the model. The worker holds `engine_lock` while it uses the engine
(one thread owns a llama context at a time). Stopping sets the worker's flag; the engine stops after the current
round and its `finally` leaves both KV caches consistent for the next prompt.

Each batch of rounds is folded into `answer` (`answer.fold`, pure) and announced with `Chat.StatsChanged`; the
app renders it in the stats panel. A finished answer is saved with its record (`summary.answer_record`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.worker import get_current_worker

from ...engine.engine import ChatTemplateError, Engine
from ...engine.stats import Stats
from ...errors import LocalspecError
from ...sampling.params import SamplingParams
from ..answer import AnswerStats, cleared, ended, fold, reloaded
from ..messages import Generated, GenerationEnded, GenerationFailed
from ..saved import saved_widgets
from ..store import ChatStore
from ..stream import accepted_spans, stream_updates
from ..summary import answer_record, meta_line, stats_from_dict
from .chat_message import AssistantMessage, UserMessage


class Chat(Vertical):
    DEFAULT_CSS = """
    Chat { height: 1fr; }
    Chat > #log { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    """

    @dataclass
    class StatsChanged(Message):
        """`answer` changed (a batch of rounds, the end of an answer, a new or reopened chat)."""

        answer: AnswerStats

    @dataclass
    class Saved(Message):
        """A conversation was created or got a message: the list of saved chats should show it."""

        conversation_id: int

    def __init__(self, *, engine_lock: threading.Lock, system: str | None = None,
                 params: SamplingParams = SamplingParams(), max_tokens: int = 1024, coloured: bool = True,
                 metrics_log=None, task: str | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.engine: Engine | None = None  # set when the models are loaded
        self.store: ChatStore | None = None  # set by the app when it opens the store
        self.engine_lock = engine_lock
        self.system = system
        self.params, self.max_tokens = params, max_tokens
        self.coloured = coloured
        self.metrics_log, self.task_label = metrics_log, task  # a metrics.MetricsLog: one JSON line per answer
        self.history: list[dict] = []  # the conversation as chat-template messages (no system)
        self.conv_id: int | None = None
        self.gen_id = 0
        self.running: set[int] = set()  # generation workers that still hold (or wait for) the engine
        self.current: AssistantMessage | None = None
        self.last_answer = ""
        self.updates_applied = 0  # Generated messages shown: each is one repaint of the answer and stats
        self.answer = AnswerStats()

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")

    def on_mount(self) -> None:
        self.query_one("#log", VerticalScroll).anchor()

    @property
    def generating(self) -> bool:
        return bool(self.running)

    # -- a turn: send -> worker -> Generated* -> GenerationEnded ----------------------------------------------
    async def send(self, text: str, *, speculate: bool) -> None:
        """Add the user's message and start the answer; `speculate`: with the drafter (the speculation setting)."""
        assert self.engine is not None and self.store is not None
        if self.conv_id is None:
            self.conv_id = self.store.new_conversation(text[:60], model=self.engine.name, system=self.system or "")
        self.store.add_message(self.conv_id, "user", text)
        self.post_message(self.Saved(self.conv_id))
        self.history.append({"role": "user", "content": text})
        await self._answer([UserMessage(text)], speculate)

    async def regenerate(self, *, speculate: bool) -> bool:
        """Answer the last message again (LM Studio's and Open WebUI's "regenerate"): its answer leaves the log,
        the history and the saved chat. The engine's cross-request cache keeps it, but at the chat's sampling a
        new answer soon goes its own way (docs/bench/lookup.md#match-buckets).
        False: no answer to replace (none yet, one being written, one that failed)."""
        log = self.query_one("#log", VerticalScroll)
        last = log.children[-1] if log.children else None
        if (self.generating or not isinstance(last, AssistantMessage) or not self.history
                or self.history[-1] != {"role": "assistant", "content": last.text}):
            return False
        assert self.store is not None
        self.history.pop()
        if self.conv_id is not None:
            self.store.drop_last_answer(self.conv_id)
        await last.remove()
        await self._answer([], speculate)
        return True

    async def _answer(self, before: list, speculate: bool) -> None:
        """Show `before` and an empty answer under it, and start writing the answer to the history."""
        log = self.query_one("#log", VerticalScroll)
        self.current = AssistantMessage(coloured=self.coloured, meta="… (Esc stops)")
        await log.mount_all([*before, self.current])
        log.anchor()
        self.gen_id += 1
        self.running.add(self.gen_id)
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + list(self.history)
        self.generate(self.gen_id, msgs, speculate)

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, gen_id: int, messages: list[dict], speculate: bool) -> None:
        worker = get_current_worker()
        engine = self.engine
        assert engine is not None
        try:
            with self.engine_lock:
                prompt = engine.chat_prompt(messages)
                for upd in stream_updates(engine, prompt, params=self.params, max_tokens=self.max_tokens,
                                          speculate=speculate, should_stop=lambda: worker.is_cancelled,
                                          metrics_log=self.metrics_log, task=self.task_label):
                    self.post_message(Generated(gen_id, upd))
        except (LocalspecError, ChatTemplateError) as e:
            self.post_message(GenerationFailed(gen_id, str(e)))
        except Exception as e:  # a bug, but the chat (and the saved conversation) should survive it
            self.post_message(GenerationFailed(gen_id, f"{type(e).__name__}: {e}"))
        finally:
            self.post_message(GenerationEnded(gen_id))

    async def on_generated(self, msg: Generated) -> None:
        if msg.gen_id != self.gen_id or self.current is None:
            return  # from a request the user left (new chat, reload)
        upd = msg.update
        self.updates_applied += 1
        await self.current.add(upd.segments)
        self.answer = fold(self.answer, upd)
        if upd.finish:
            await self.current.end_stream()
            self._finish_answer()
        self.post_message(self.StatsChanged(self.answer))

    def _finish_answer(self) -> None:
        assert self.current is not None and self.engine is not None and self.store is not None
        d = answer_record(self.answer, drafter=self.engine.drafter_name,
                          accepted_spans=accepted_spans(self.current.segments))
        self.current.set_meta(meta_line(d))
        self.last_answer = self.current.text
        self.history.append({"role": "assistant", "content": self.last_answer})
        if self.conv_id is not None:
            self.store.add_message(self.conv_id, "assistant", self.last_answer, stats=d)
            self.post_message(self.Saved(self.conv_id))

    def on_generation_failed(self, msg: GenerationFailed) -> None:
        if msg.gen_id != self.gen_id or self.current is None:
            return
        self.current.set_meta(f"error: {msg.error}", error=True)
        if self.history and self.history[-1]["role"] == "user":
            self.history.pop()  # the next prompt should not carry the one that failed

    def on_generation_ended(self, msg: GenerationEnded) -> None:
        self.running.discard(msg.gen_id)
        if msg.gen_id == self.gen_id:
            self.current = None
            self.answer = ended(self.answer)
            self.post_message(self.StatsChanged(self.answer))

    def stop(self) -> None:
        """Stop the running answer after its current round (it keeps what was written)."""
        if self.generating:
            self.workers.cancel_group(self, "generate")

    def leave(self) -> None:
        """Stop the running answer, if any, and ignore its late messages (gen_id moves on)."""
        self.stop()
        self.gen_id += 1
        self.current = None

    # -- whole conversations ----------------------------------------------------------------------------------
    async def clear(self) -> None:
        """A new chat: empty log and history; the next message starts a new saved conversation."""
        self.leave()
        self.conv_id = None
        self.history = []
        await self.query_one("#log", VerticalScroll).remove_children()
        self.answer = cleared(self.answer)
        self.post_message(self.StatsChanged(self.answer))

    async def open(self, conversation_id: int) -> bool:
        """Show a saved chat and continue it; each answer shows the stats it was written with. False: gone."""
        assert self.store is not None
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return False
        self.leave()
        log = self.query_one("#log", VerticalScroll)
        await log.remove_children()
        widgets, self.history, last = saved_widgets(self.store, conversation_id, coloured=self.coloured)
        await log.mount_all(widgets)
        log.scroll_end(animate=False)
        self.conv_id, self.system = conv.id, conv.system or self.system
        self.last_answer = last.content if last else ""
        saved = (last.stats or {}) if last else {}
        self.answer = reloaded(self.answer, stats_from_dict(saved) if saved else Stats(), saved)
        self.post_message(self.StatsChanged(self.answer))
        return True

    async def set_coloured(self, on: bool) -> None:
        self.coloured = on
        for m in self.query(AssistantMessage):
            await m.set_coloured(on)
