"""`localspec chat`: a Textual chat that shows speculative decoding at work.

Threading: the models load in a thread worker, and each answer is generated in a thread worker that iterates
`Engine.generate` (through `stream.stream_updates`, which batches rounds to <= 20 UI updates a second) and posts
Messages. The UI thread never calls the model. A lock serialises workers on the engine (one thread owns a llama
context at a time); cancelling (Esc, ctrl+c) sets the worker's flag, the engine stops after the current round,
and its `finally` leaves both KV caches consistent for the next prompt.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header
from textual.worker import get_current_worker

from ..errors import LocalspecError
from ..sampling import SamplingParams
from ..session import ChatTemplateError, Engine
from ..stats import Stats
from .palette import chat_commands
from .messages import EngineFailed, EngineReady, Generated, GenerationEnded, GenerationFailed, LoadProgress
from .screens.loading import LoadingScreen
from .store import ChatStore
from .saved import saved_widgets
from .stream import accepted_spans, log_request, stream_updates
from .summary import (AUTO, auto_off_reason, current_k, is_adaptive, meta_line, next_k, set_draft_length, spec_reason,
                      stats_from_dict)
from .widgets.chat_message import AssistantMessage, UserMessage
from .widgets.conversation_list import ConversationList
from .widgets.prompt_input import PromptInput
from .widgets.stats_panel import HISTORY, StatsPanel, StatsView


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "localspec chat"
    BINDINGS = [
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+s", "toggle_spec", "Spec on/off", priority=True),
        Binding("ctrl+k", "cycle_k", "Change k", priority=True),
        Binding("ctrl+t", "toggle_colour", "Colour drafts", priority=True),
        Binding("ctrl+y", "copy_last", "Copy answer", priority=True),
        Binding("ctrl+b", "toggle_sidebar", "Chats", priority=True),
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+c", "stop_or_hint", "Stop", show=False, priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, engine: Engine | None = None, *, spec=None, system: str | None = None,
                 params: SamplingParams = SamplingParams(), max_tokens: int = 1024,
                 store_path: Path | None = None, coloured: bool = True, metrics_log=None,
                 task: str | None = None) -> None:
        """Pass a built `engine` (tests, embedding), or an `EngineSpec` to load in a worker (the CLI)."""
        super().__init__()
        self.engine = engine
        self.spec = spec
        self._owns_engine = engine is None
        self.system = system
        self.params = params
        self.max_tokens = max_tokens
        self.store_path = store_path
        self.coloured = coloured
        self.metrics_log, self.task_label = metrics_log, task  # a metrics.MetricsLog: one JSON line per answer
        self.spec_on = bool(engine and engine.drafter)
        self.history: list[dict] = []  # the conversation as chat-template messages (no system)
        self.conv_id: int | None = None
        self.gen_id = 0
        self.running: set[int] = set()  # generation workers that still hold (or wait for) the engine
        self.current: AssistantMessage | None = None
        self.last_answer = ""
        self.updates_applied = 0  # Generated messages shown: each is one repaint of the answer and stats
        self._lock = threading.Lock()
        self._stats = Stats()
        self._mode = "plain"
        self._k_used = 0
        self._inflight: Stats | None = None
        self._tps_now = 0.0
        self._session = [0, 0]  # finished answers: draft_n, draft_n_accepted
        self._tps: deque[float] = deque(maxlen=HISTORY)
        self._acc: deque[float] = deque(maxlen=HISTORY)
        self.store: ChatStore | None = None
        self.load_error: EngineFailed | None = None  # the CLI prints it again after the app closes
        self._adaptive: object | None = None  # the session's adaptive controller, kept while k is pinned

    # -- layout and start-up ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield ConversationList(id="conversations")
            with Vertical(id="chat"):
                yield VerticalScroll(id="log")
                yield PromptInput(id="prompt", placeholder="Message (Enter sends, ↑ history, ctrl+p commands)")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.store = ChatStore(self.store_path)
        self.query_one(PromptInput).history = self.store.recent_inputs()
        self.query_one(PromptInput).remember("")
        self.query_one("#log", VerticalScroll).anchor()
        self._refresh_conversations()
        if self.engine is not None:
            self._engine_ready(self.engine)
        else:
            name = getattr(self.spec, "model", None) or "the default model"
            self.push_screen(LoadingScreen(name))
            self.load()

    @work(thread=True, exclusive=True, group="load")
    def load(self) -> None:
        from ..loader import EngineSpec, load_engine

        try:
            engine = load_engine(self.spec or EngineSpec(), log=lambda m: self.post_message(LoadProgress(str(m))))
        except LocalspecError as e:
            self.post_message(EngineFailed(str(e), e.exit_code))
        except Exception as e:  # llama.cpp or the file system said no: still one line, in the app
            self.post_message(EngineFailed(f"{type(e).__name__}: {e}"))
        else:
            self.post_message(EngineReady(engine))

    def on_load_progress(self, msg: LoadProgress) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.screen.progress(msg.text)

    def on_engine_failed(self, msg: EngineFailed) -> None:
        self.load_error = msg
        if isinstance(self.screen, LoadingScreen):
            self.screen.fail(msg.error)

    def on_engine_ready(self, msg: EngineReady) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()
        self._engine_ready(msg.engine)

    def _engine_ready(self, engine: Engine) -> None:
        self.engine = engine
        self.spec_on = engine.drafter is not None
        self._adaptive = engine.controller if is_adaptive(engine.controller) else None
        self.sub_title = f"{engine.name} · drafter {engine.drafter_name}"
        self._show_stats()
        self.query_one(PromptInput).focus()

    async def on_unmount(self) -> None:
        self.workers.cancel_group(self, "generate")
        with self._lock:  # the worker finishes its round first
            if self.engine is not None and self._owns_engine:
                self.engine.close()
        if self.store:
            self.store.close()

    # -- a turn: submit -> worker -> Generated* -> GenerationEnded --------------------------------------------
    async def on_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.engine is None:
            self.notify("the model is not loaded yet", severity="warning")
            return
        if self.generating:
            self.notify("still answering; Esc stops it", severity="warning")
            return
        event.input.value = ""
        self.query_one(PromptInput).remember(text)
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add the user's message and start the answer (also the entry point for scripts and tests)."""
        assert self.engine is not None and self.store is not None
        if self.conv_id is None:
            self.conv_id = self.store.new_conversation(text[:60], model=self.engine.name, system=self.system or "")
            self._refresh_conversations()
        self.store.add_message(self.conv_id, "user", text)
        self.history.append({"role": "user", "content": text})
        log = self.query_one("#log", VerticalScroll)
        self.current = AssistantMessage(coloured=self.coloured, meta="… (Esc stops)")
        await log.mount_all([UserMessage(text), self.current])
        log.anchor()
        self.gen_id += 1
        self.running.add(self.gen_id)
        self._inflight = None
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + list(self.history)
        self.generate(self.gen_id, msgs, self.spec_on)

    @property
    def generating(self) -> bool:
        return bool(self.running)

    @property
    def answer_stats(self) -> Stats | None:
        """Running stats of the answer being written (None between answers)."""
        return self._inflight

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, gen_id: int, messages: list[dict], spec: bool) -> None:
        worker = get_current_worker()
        engine = self.engine
        assert engine is not None
        try:
            with self._lock:
                prompt = engine.chat_prompt(messages)
                before = engine.controller.state() if spec and engine.drafter else None
                upd = None
                for upd in stream_updates(engine, prompt, params=self.params, max_tokens=self.max_tokens,
                                          spec=spec, should_stop=lambda: worker.is_cancelled):
                    self.post_message(Generated(gen_id, upd))
                if self.metrics_log and upd is not None:
                    log_request(self.metrics_log, engine, upd, spec=spec, before=before, task=self.task_label)
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
        if upd.tps_now:
            self._tps.append(upd.tps_now)
        self._acc.extend(upd.acceptance)
        self._stats, self._mode, self._k_used, self._inflight = upd.stats, upd.mode, upd.k_used, upd.stats
        if upd.finish:
            await self.current.end_stream()
            self._finish_answer(upd.finish)
        self._tps_now = upd.tps_now or self._tps_now
        self._show_stats()

    def _finish_answer(self, finish: str) -> None:
        assert self.current is not None and self.engine is not None and self.store is not None
        s = self._stats
        self._session[0] += s.draft_n
        self._session[1] += s.draft_n_accepted
        self._inflight = None
        spec = bool(s.draft_n)
        d = s.to_dict() | {"mode": "spec" if spec else "plain", "drafter": self.engine.drafter_name if spec else "none",
                           "k": self.k_label if spec else 0, "finish": finish,
                           "accepted_spans": accepted_spans(self.current.segments)}
        self.current.set_meta(meta_line(d))
        self.last_answer = self.current.text
        self.history.append({"role": "assistant", "content": self.last_answer})
        if self.conv_id is not None:
            self.store.add_message(self.conv_id, "assistant", self.last_answer, stats=d)
            self._refresh_conversations()

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
            self._show_stats()

    # -- stats ------------------------------------------------------------------------------------------------
    def stats_view(self) -> StatsView:
        e = self.engine
        inflight = self._inflight or Stats()
        return StatsView(
            stats=self._stats, tps_now=self._tps_now, session_draft_n=self._session[0] + inflight.draft_n,
            session_accepted=self._session[1] + inflight.draft_n_accepted,
            drafter=e.drafter_name if e else "none", mode=self._mode,
            k=current_k(e) if e and e.drafter and self.spec_on else 0, k_used=self._k_used,
            k_mode="auto" if e and is_adaptive(e.controller) else "fixed",
            spec_on=bool(e and e.drafter and self.spec_on),
            auto_off=bool(e and e.drafter and self.spec_on and auto_off_reason(e.controller)),
            spec_reason=spec_reason(e, self.spec_on, last_mode=self._mode, rounds=self._stats.rounds) if e else "",
            tps_history=tuple(self._tps), acc_history=tuple(self._acc))

    @property
    def k_label(self) -> str | int:
        e = self.engine
        return "auto" if e is None or is_adaptive(e.controller) else current_k(e)

    def _show_stats(self) -> None:
        self.query_one(StatsPanel).show(self.stats_view())

    # -- actions (footer keys and command palette) ------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("new_chat", "toggle_spec", "cycle_k", "set_k", "copy_last", "toggle_colour") \
                and self.engine is None:
            return False
        return True

    def action_stop(self) -> None:
        if self.generating:
            self.workers.cancel_group(self, "generate")

    def action_stop_or_hint(self) -> None:
        if self.generating:
            self.action_stop()
        else:
            self.notify("press ctrl+q to quit")

    async def action_new_chat(self) -> None:
        self._leave_current()
        self.conv_id = None
        self.history = []
        await self.query_one("#log", VerticalScroll).remove_children()
        self._stats, self._mode, self._k_used, self._tps_now = Stats(), "plain", 0, 0.0
        self._show_stats()
        self.query_one(PromptInput).focus()

    def _leave_current(self) -> None:
        """Stop the running answer, if any; its late messages are ignored (gen_id moves on)."""
        if self.generating:
            self.workers.cancel_group(self, "generate")
        self.gen_id += 1
        self.current = None

    def action_toggle_spec(self) -> None:
        if self.engine is None or self.engine.drafter is None:
            self.notify("no drafter loaded: start with --lookup or --draft MODEL", severity="warning")
            return
        self.spec_on = not self.spec_on
        self._show_stats()
        self.notify(f"speculation {'on' if self.spec_on else 'off'} (from the next answer)")

    def action_cycle_k(self) -> None:
        if self.engine is not None:
            now = AUTO if is_adaptive(self.engine.controller) else current_k(self.engine)
            self.action_set_k(next_k(now, auto=self._adaptive is not None))

    def action_set_k(self, k: int) -> None:
        if self.engine is not None:
            self.notify(set_draft_length(self.engine, int(k), self._adaptive))
            self._show_stats()

    async def action_toggle_colour(self) -> None:
        self.coloured = not self.coloured
        for m in self.query(AssistantMessage):
            await m.set_coloured(self.coloured)
        self.notify("accepted drafts coloured" if self.coloured else "Markdown view")

    def action_copy_last(self) -> None:
        if not self.last_answer:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.copy_to_clipboard(self.last_answer)
        self.notify(f"copied the last answer ({len(self.last_answer)} characters)")

    def action_toggle_sidebar(self) -> None:
        self.query_one(ConversationList).toggle_class("-hidden")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from chat_commands(self)

    # -- saved conversations ----------------------------------------------------------------------------------
    def _refresh_conversations(self) -> None:
        if self.store:
            self.query_one(ConversationList).set_conversations(self.store.conversations(), current=self.conv_id)

    async def on_conversation_list_chosen(self, msg: ConversationList.Chosen) -> None:
        await self.open_conversation(msg.conversation_id)

    async def on_conversation_list_deleted(self, msg: ConversationList.Deleted) -> None:
        assert self.store is not None
        self.store.delete(msg.conversation_id)
        if msg.conversation_id == self.conv_id:
            await self.action_new_chat()
        self._refresh_conversations()

    async def open_conversation(self, conversation_id: int) -> None:
        """Show a saved chat and continue it; each answer shows the stats it was written with."""
        assert self.store is not None
        conv = self.store.conversation(conversation_id)
        if conv is None:
            self.notify("that conversation is gone", severity="warning")
            return
        self._leave_current()
        log = self.query_one("#log", VerticalScroll)
        await log.remove_children()
        widgets, self.history, last = saved_widgets(self.store, conversation_id, coloured=self.coloured)
        await log.mount_all(widgets)
        log.scroll_end(animate=False)
        self.conv_id, self.system = conv.id, conv.system or self.system
        self.last_answer = last.content if last else ""
        self._stats = stats_from_dict(last.stats) if last and last.stats else Stats()
        self._mode = (last.stats or {}).get("mode", "plain") if last else "plain"
        self._show_stats()
        self.query_one(PromptInput).focus()
