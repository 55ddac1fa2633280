"""`localspec chat`: a Textual chat that shows speculative decoding at work.

The app is the wiring: the layout, the keys, loading the models, and the saved-conversation list. The parts:

- `widgets/chat.py` `Chat`: the conversation (history, the saved chat, the log) and streaming (a thread worker
  per answer that iterates `Engine.generate` through `stream.stream_updates`); it folds each batch of rounds into
  an `AnswerStats` (`answer.py`, pure) and says so with `Chat.StatsChanged`.
- `controls.py` `SpecControls`: the only code that changes the engine (speculation auto / on / off, γ).
- `widgets/stats_panel.py`: renders the `AnswerStats`, the controls' `SpecStatus` and the engine's `ThreadState`
  (thread counts in use and why they changed); it never reads the engine.
- `palette.py`: the command palette entries, as (title, help, action) data.
- `screens/models.py` `ModelPicker` (ctrl+o): switch models without restarting; the chat goes on with the new one.

Threading: the models load in a thread worker (`load`; after a switch it first closes the old engine), answers
are generated in the Chat's thread worker, and the UI thread never calls the model. One lock serialises workers on
the engine; closing the app waits for it.

The end: SIGHUP (the terminal closed), SIGTERM, SIGINT and a terminal found hung up end the app as ctrl+q does,
after the answer being written was stopped and saved as Esc would (`end`; terminal.py says why each is needed).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header

from ..engine.engine import Engine
from ..errors import LocalspecError
from ..models import LOOKUP
from ..sampling.params import SamplingParams
from ..speculative.types import NO_DRAFTER, ControllerState
from ..tuning.threads import ThreadState
from .controls import AUTO, OFF, ON, SpecControls, SpecStatus
from .messages import EngineFailed, EngineReady, LoadProgress
from .palette import chat_commands
from .screens.loading import LoadingScreen
from .screens.models import ModelPicker
from .store import ChatStore
from .terminal import CHECK_EVERY, hung_up, quiet_driver, terminal_fd, watch
from .widgets.chat import Chat
from .widgets.conversation_list import ConversationList
from .widgets.prompt_input import PromptInput
from .widgets.stats_panel import StatsPanel

if TYPE_CHECKING:
    from ..engine.loader import EngineConfig

SAVE_WAIT = 3.0  # seconds the answer being written gets to stop and be saved when the chat must end
QUIT_AGAIN = 2.0  # seconds within which a second ctrl+c quits (the first stops an answer, or says so)
NEEDS_ENGINE = ("new_chat", "regenerate", "cycle_spec", "spec", "cycle_k", "set_k", "copy_last", "toggle_colour")


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "localspec chat"
    BINDINGS = [
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+r", "regenerate", "Regenerate", priority=True),
        # one ctrl+s binding per setting, shown only for the current one: the footer names the setting
        *(Binding("ctrl+s", f"cycle_spec('{s}')", f"Spec: {s}", priority=True) for s in (AUTO, ON, OFF)),
        Binding("ctrl+k", "cycle_k", "Change k", priority=True),
        Binding("ctrl+t", "toggle_colour", "Colour drafts", priority=True),
        Binding("ctrl+y", "copy_last", "Copy answer", priority=True),
        Binding("ctrl+b", "toggle_sidebar", "Chats", priority=True),
        Binding("ctrl+o", "pick_model", "Models", priority=True),
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+c", "stop_or_hint", "Stop", show=False, priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, engine: Engine | None = None, *, config: EngineConfig | None = None, system: str | None = None,
                 params: SamplingParams = SamplingParams(), max_tokens: int = 1024,
                 store_path: Path | None = None, coloured: bool = True, metrics_log=None,
                 task: str | None = None) -> None:
        """Pass a built `engine` (tests, embedding), or an `EngineConfig` to load in a worker (the CLI)."""
        super().__init__()
        self.engine = engine
        self.config = config
        self._owns_engine = engine is None
        self.store_path = store_path
        self._lock = threading.Lock()
        self.chat = Chat(engine_lock=self._lock, system=system, params=params, max_tokens=max_tokens, coloured=coloured,
                         metrics_log=metrics_log, task=task, id="chat")
        self.controls: SpecControls | None = None  # with the engine
        self.store: ChatStore | None = None
        self.load_error: EngineFailed | None = None  # the CLI prints it again after the app closes
        self.ending = False
        self._ctrl_c = -QUIT_AGAIN  # when ctrl+c last found nothing to stop

    def get_driver_class(self):
        return quiet_driver(super().get_driver_class())

    # -- layout and start-up ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield ConversationList(id="conversations")
            with Vertical(id="main"):
                yield self.chat
                yield PromptInput(id="prompt", placeholder="Message (Enter sends, ↑ history, ctrl+p commands)")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.store = self.chat.store = ChatStore(self.store_path)
        self.query_one(PromptInput).history = self.store.recent_inputs()
        self.query_one(PromptInput).remember("")
        self._refresh_conversations()
        if not self.is_headless:
            self._watch_the_end()
        if self.engine is not None:
            self._engine_ready(self.engine)
        else:
            name = getattr(self.config, "model", None) or "the default model"
            self.push_screen(LoadingScreen(name))
            self.load()

    @work(thread=True, exclusive=True, group="load")
    def load(self, previous: Engine | None = None) -> None:
        from ..engine.loader import EngineConfig, load_engine

        if previous is not None:  # a switch: the old model's memory is freed before the new one loads
            with self._lock:
                previous.close()
        try:
            engine = load_engine(self.config or EngineConfig(), log=lambda m: self.post_message(LoadProgress(str(m))))
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

    # -- switching models -----------------------------------------------------------------------------------
    def action_pick_model(self) -> None:
        if self.generating:
            self.notify("still answering; Esc stops it", severity="warning")
            return
        self._open_picker()

    @work(thread=True, exclusive=True, group="catalog")
    def _open_picker(self) -> None:
        """The registry and the GGUF headers are read off the UI thread."""
        from ..models.catalog import catalog

        try:
            models = catalog()
        except LocalspecError as e:
            self.call_from_thread(self.notify, str(e), severity="error")
            return
        current = self.engine.name if self.engine is not None else None
        self.call_from_thread(self.push_screen, ModelPicker(models, current), self.switch_model)

    def switch_model(self, name: str | None) -> None:
        """Unload the current engine and load `name` with the same options. A model drafter given with --draft
        is dropped (it may not share the new model's tokenizer): the new model's pair, else prompt lookup."""
        from ..engine.loader import EngineConfig

        if name is None or self.generating:
            return
        config = self.config or EngineConfig()
        keep = config.draft in (LOOKUP, NO_DRAFTER)
        self.config = replace(config, model=name, draft=config.draft if keep else None)
        previous = self.engine if self._owns_engine else None  # an engine handed in belongs to its caller
        self.engine = self.chat.engine = None
        self.controls = None
        self._owns_engine = True
        self.refresh_bindings()
        self.push_screen(LoadingScreen(name, back="pick_model"))
        self.load(previous)

    def _engine_ready(self, engine: Engine) -> None:
        self.engine = self.chat.engine = engine
        self.controls = SpecControls(engine)
        self.sub_title = f"{engine.name} · drafter {engine.drafter_name}"
        self._show_stats()
        self.refresh_bindings()
        self.query_one(PromptInput).focus()

    # -- the end ------------------------------------------------------------------------------------------------
    def _watch_the_end(self) -> None:
        watch(asyncio.get_running_loop(), self.end_soon)
        fd = terminal_fd()
        if fd is not None:
            self.set_interval(CHECK_EVERY, lambda: self.end_soon() if hung_up(fd) else None)

    def end_soon(self) -> None:
        self.run_worker(self.end(), group="end")

    async def end(self) -> None:
        """Stop the answer being written, as Esc does (its end is saved), wait up to SAVE_WAIT seconds for it,
        then exit as ctrl+q does."""
        if self.ending:
            return
        self.ending = True
        self.chat.stop()
        deadline = time.monotonic() + SAVE_WAIT
        while self.generating and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.exit()

    async def on_unmount(self) -> None:
        self.workers.cancel_group(self.chat, "generate")
        with self._lock:  # the worker finishes its round first
            if self.engine is not None and self._owns_engine:
                self.engine.close()
        if self.store:
            self.store.close()

    # -- a turn ---------------------------------------------------------------------------------------------
    async def on_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.controls is None:
            self.notify("the model is not loaded yet", severity="warning")
            return
        if self.generating:
            self.notify("still answering; Esc stops it", severity="warning")
            return
        event.input.value = ""
        self.query_one(PromptInput).remember(text)
        await self.chat.send(text, speculate=self.controls.drafting)

    @property
    def generating(self) -> bool:
        return self.chat.generating

    def on_chat_stats_changed(self, msg: Chat.StatsChanged) -> None:
        self._show_stats()

    def on_chat_saved(self, msg: Chat.Saved) -> None:
        self._refresh_conversations()

    # -- stats ----------------------------------------------------------------------------------------------
    def controller_state(self) -> ControllerState | None:
        """The controller's latest state: the worker's snapshot while it owns the controller, else read now."""
        if self.controls is None:
            return None
        return self.chat.answer.controller if self.generating else self.controls.snapshot()

    def spec_status(self) -> SpecStatus:
        return self.controls.status(self.controller_state()) if self.controls else SpecStatus()

    def thread_state(self) -> ThreadState | None:
        """Thread counts in use: the worker's snapshot while it owns the thread controller, else read now."""
        if self.engine is None or self.engine.threads is None:
            return None
        return self.chat.answer.threads if self.generating else self.engine.threads.state()

    def _show_stats(self) -> None:
        self.query_one(StatsPanel).show(self.chat.answer, self.spec_status(), self.thread_state())

    # -- actions (footer keys and command palette) ------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in NEEDS_ENGINE and self.controls is None:
            return False
        if action == "cycle_spec":  # the binding of the current setting is the one shown (and run)
            return self.controls is not None and parameters[0] == self.controls.setting
        return True

    @property
    def _controls(self) -> SpecControls:
        """The controls, for the actions `check_action` allows only once the engine (and so they) exist."""
        if self.controls is None:
            raise RuntimeError("no engine loaded yet")
        return self.controls

    def action_stop(self) -> None:
        self.chat.stop()

    def action_stop_or_hint(self) -> None:
        """ctrl+c: stop the answer; with none, quit when pressed twice (Textual's raw terminal sends no SIGINT)."""
        if self.generating:
            self.chat.stop()
        elif time.monotonic() - self._ctrl_c < QUIT_AGAIN:
            self.end_soon()
        else:
            self._ctrl_c = time.monotonic()
            self.notify("press ctrl+c again (or ctrl+q) to quit")

    async def action_regenerate(self) -> None:
        if self.generating:
            self.notify("still answering; Esc stops it", severity="warning")
        elif not await self.chat.regenerate(speculate=self._controls.drafting):
            self.notify("no answer to regenerate", severity="warning")

    async def action_new_chat(self) -> None:
        await self.chat.clear()
        self.query_one(PromptInput).focus()

    def action_cycle_spec(self, current: str) -> None:
        self._control(self._controls.cycle(self.controller_state()), setting=True)

    def action_spec(self, setting: str) -> None:
        self._control(self._controls.set(setting, self.controller_state()), setting=True)

    def action_cycle_k(self) -> None:
        self._control(self._controls.cycle_k())

    def action_set_k(self, k: int) -> None:
        self._control(self._controls.set_k(int(k)))

    def _control(self, notice: str, *, setting: bool = False) -> None:
        """After a control changed the engine: say what changed, repaint the panel and the footer."""
        later = setting and self.generating
        self.notify(notice + (" (from the next answer)" if later else ""))
        self._show_stats()
        self.refresh_bindings()

    async def action_toggle_colour(self) -> None:
        await self.chat.set_coloured(not self.chat.coloured)
        self.notify("accepted drafts coloured" if self.chat.coloured else "Markdown view")

    def action_copy_last(self) -> None:
        last = self.chat.last_answer
        if not last:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.copy_to_clipboard(last)
        self.notify(f"copied the last answer ({len(last)} characters)")

    def action_toggle_sidebar(self) -> None:
        self.query_one(ConversationList).toggle_class("-hidden")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for c in chat_commands(self.controls):
            yield SystemCommand(c.title, c.help, partial(self.run_action, c.action))

    # -- saved conversations ----------------------------------------------------------------------------------
    def _refresh_conversations(self) -> None:
        if self.store:
            self.query_one(ConversationList).set_conversations(self.store.conversations(), current=self.chat.conv_id)

    async def on_conversation_list_chosen(self, msg: ConversationList.Chosen) -> None:
        await self.open_conversation(msg.conversation_id)

    async def on_conversation_list_deleted(self, msg: ConversationList.Deleted) -> None:
        assert self.store is not None
        self.store.delete(msg.conversation_id)
        if msg.conversation_id == self.chat.conv_id:
            await self.action_new_chat()
        self._refresh_conversations()

    async def open_conversation(self, conversation_id: int) -> None:
        """Show a saved chat and continue it; each answer shows the stats it was written with."""
        if not await self.chat.open(conversation_id):
            self.notify("that conversation is gone", severity="warning")
            return
        self._refresh_conversations()
        self.query_one(PromptInput).focus()
