"""The chat app driven for real: Textual's pilot, the embedded SmolLM2-135M, prompt-lookup drafting.

One engine is loaded per module and handed to each app, so the suite loads the model once.
"""

from __future__ import annotations

import re
import time

import pytest

from localspec.engine.engine import ChatTemplateError
from localspec.engine.loader import EngineConfig, load_engine
from localspec.engine.metrics import MetricsLog, read_log
from localspec.tui.app import ChatApp
from localspec.tui.controls import K_STEPS
from localspec.tui.screens.loading import LoadingScreen
from localspec.tui.widgets.chat_message import AssistantMessage, UserMessage
from localspec.tui.widgets.conversation_list import ConversationList
from localspec.tui.widgets.stats_panel import StatsPanel
from localspec.tuning.controller import Adaptive
from localspec.tuning.fixed import FixedK

pytestmark = pytest.mark.slow

REPEAT = "Write this line three times: the quick brown fox jumps over the lazy dog."
SIZE = (140, 40)
THREADS = 1  # one llama.cpp thread: on a shared 2-core CI box two threads spin against each other


@pytest.fixture(scope="module")
def engine(smollm2_path):
    config = EngineConfig(model=str(smollm2_path), draft="lookup", k=4, n_ctx=1024, adaptive=False,  # FixedK(4)
                      threads=THREADS)
    e = load_engine(config, log=lambda *a: None)
    yield e
    e.close()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True)
def fixed_k(engine):
    loaded = engine.controller
    yield
    engine.controller = loaded  # tests below change the controller and k; start each from the pair's
    loaded.k = 4


async def wait_until(pilot, cond, timeout: float = 90.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting for the app"
        await pilot.pause(0.02)


async def ask(pilot, text: str) -> AssistantMessage:
    """Type a prompt like a person, press Enter, wait for the worker to finish; return the answer widget."""
    app = pilot.app
    n = len(app.query(AssistantMessage))
    await pilot.press(*text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: len(app.query(AssistantMessage)) > n)
    await wait_until(pilot, lambda: not app.generating)
    await pilot.pause()
    return app.query(AssistantMessage).last()


def panel(app) -> str:
    return app.query_one(StatsPanel).text()


async def test_answer_streams_with_live_stats(engine, tmp_path):
    app = ChatApp(engine, max_tokens=48, metrics_log=MetricsLog(tmp_path / "m.jsonl"), task="tui")
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, REPEAT)
        assert answer.text.strip()
        assert answer.text == app.chat.last_answer
        assert app.query_one(UserMessage).text == REPEAT
        text = panel(app)
        assert float(re.search(r"tok/s\s+([\d.]+) now", text).group(1)) > 0
        assert float(re.search(r"([\d.]+) message", text).group(1)) > 0
        assert re.search(r"accept\s+\d+% \(\d+/\d+\) msg", text), text  # lookup drafted: a number, not "–"
        assert re.search(r"\d+% \(\d+/\d+\) session", text)
        assert re.search(r"len\s+\d\.\d\d tok/pass", text) and re.search(r"ttft\s+\d+ ms", text)
        assert "speculation ON" in text and "drafter lookup" in text
        assert f"threads {THREADS} (batch {THREADS}, pinned)" in text and "pinned (--threads)" in text
        stats = app.chat.answer.stats
        assert stats.draft_n > 0 and stats.n_generated > 0
        if stats.draft_n_accepted:  # accepted drafts are coloured
            assert answer.accepted_text and any(s.accepted for s in answer.segments)
        assert "tok/s" in answer.meta and "accepted" in answer.meta
        # batching: fewer UI updates than verify rounds, and the panel's sparklines got data
        assert 1 <= app.chat.updates_applied <= stats.rounds
        assert app.chat.answer.tps_history and app.chat.answer.acc_history
    [rec] = list(read_log(tmp_path / "m.jsonl"))  # --metrics-log: one line per answer
    assert rec["front_end"] == "chat" and rec["task"] == "tui" and rec["draft_n"] == stats.draft_n


async def test_updates_are_batched_to_twenty_per_second(engine):
    app = ChatApp(engine, max_tokens=64)
    async with app.run_test(size=SIZE) as pilot:
        t0 = time.monotonic()
        await ask(pilot, "Count from one to fifty in words, separated by commas.")
        elapsed = time.monotonic() - t0
        assert 1 <= app.chat.updates_applied <= 20 * elapsed + 2  # the batching rule itself: test_tui_widgets.py
        assert app.chat.updates_applied <= app.chat.answer.stats.rounds


def footer_spec(app) -> str:
    """What the footer says for ctrl+s (the binding of the current setting is the one shown)."""
    return app.screen.active_bindings["ctrl+s"].binding.description


async def test_toggling_speculation_changes_the_mode(engine):
    app = ChatApp(engine, max_tokens=24)  # FixedK(4): "on" and "off", no "auto"
    async with app.run_test(size=SIZE) as pilot:
        assert "speculation ON" in panel(app) and footer_spec(app) == "Spec: on"
        await pilot.press("ctrl+s")
        assert "speculation OFF" in panel(app) and "switched off" in panel(app) and footer_spec(app) == "Spec: off"
        await ask(pilot, REPEAT)
        assert app.chat.answer.stats.draft_n == 0
        assert "mode   plain" in panel(app)
        assert "· plain" in app.query(AssistantMessage).last().meta and "drafted nothing" not in panel(app)
        await pilot.press("ctrl+s")
        assert "speculation ON" in panel(app)
        await ask(pilot, "Say it once more: the quick brown fox jumps over the lazy dog.")
        assert app.chat.answer.stats.draft_n > 0 and "spec: lookup k=4" in app.query(AssistantMessage).last().meta


async def test_auto_off_is_labelled_with_the_controllers_words(engine):
    # an adaptive controller for which lookup cannot pay (each drafted token costs 5 target steps): off from the start
    engine.controller = Adaptive(sources=("lookup",), c={"lookup": 5.0}, learn_costs=False)
    app = ChatApp(engine, max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        assert "speculation AUTO-OFF" in panel(app) and footer_spec(app) == "Spec: auto"
        assert "off now: lookup: it would be" in panel(app) and "k      auto · now off" in panel(app)
        answer = await ask(pilot, REPEAT)
        assert app.chat.answer.stats.draft_n == 0 and "mode   auto-off" in panel(app)
        assert "auto-off: lookup: it would be" in answer.meta and "k=" not in answer.meta  # not "spec: lookup k=auto"
        assert app.store.messages(app.chat.conv_id)[-1].stats["mode"] == "auto-off"
        await pilot.press("ctrl+s")  # auto -> on: speculation forced on, whatever the controller thinks
        assert "speculation ON" in panel(app) and footer_spec(app) == "Spec: on"
        assert isinstance(engine.controller, FixedK)
        answer = await ask(pilot, "Once more: the quick brown fox jumps over the lazy dog.")
        k = engine.controller.k
        assert app.chat.answer.stats.draft_n > 0 and f"spec: lookup k={k}" in answer.meta
        assert f"k      {k} fixed · answer {k}" in panel(app)
        await pilot.press("ctrl+s", "ctrl+s")  # on -> off -> auto: the adaptive controller again
        assert "speculation AUTO-OFF" in panel(app) and isinstance(engine.controller, Adaptive)


async def test_escape_cancels_and_the_next_prompt_works(engine):
    app = ChatApp(engine, max_tokens=900)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"Write a very long story about a dragon who learns to bake bread.")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.updates_applied >= 2)
        first = app.query(AssistantMessage).last()
        # (each pilot key waits up to ~2 s for the process to look idle; the worker thread keeps it busy)
        await pilot.press("ctrl+t")  # the UI answers keys while the worker generates
        assert not first.coloured and app.generating
        app.query_one("#prompt").value = "too soon"
        await pilot.press("enter")  # one answer at a time: the prompt waits in the box
        assert app.query_one("#prompt").value == "too soon" and len(app.query(AssistantMessage)) == 1
        app.query_one("#prompt").value = ""
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)
        assert "cancelled" in first.meta
        assert 0 < app.chat.answer.stats.n_generated < 900
        # the caches stayed consistent: the conversation goes on (a short answer: on a busy machine up to 900
        # tokens of a story that goes on can take longer than wait_until's guard)
        app.chat.max_tokens = 48
        answer = await ask(pilot, "Now say hello.")
        assert answer is not first and answer.text.strip()
        assert "error" not in answer.meta and "cancelled" not in answer.meta
        assert len(app.chat.history) == 4  # user, partial answer, user, answer


async def test_saved_conversation_reloads(engine, home):
    app = ChatApp(engine, max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        first = await ask(pilot, "What is the capital of France?")
        answer, meta, accepted = first.text, first.meta, first.accepted_text
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not app.query(AssistantMessage) and app.chat.history == []
    assert (home / "chats.sqlite").exists()

    app2 = ChatApp(engine, max_tokens=16)  # a fresh app finds it in the side panel
    async with app2.run_test(size=SIZE) as pilot:
        convs = app2.query_one(ConversationList)
        assert convs.option_count == 1
        convs.focus()
        convs.highlighted = 0
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app2.query(AssistantMessage)) == 1)
        assert app2.query_one(UserMessage).text == "What is the capital of France?"
        reloaded = app2.query_one(AssistantMessage)
        assert reloaded.text == answer and reloaded.meta == meta  # each message keeps its stats ...
        assert reloaded.accepted_text == accepted  # ... and where the drafter was right
        assert app2.chat.history == [{"role": "user", "content": "What is the capital of France?"},
                                {"role": "assistant", "content": answer}]
        assert "tok/s" in panel(app2)
        app2.query_one("#prompt").focus()
        await ask(pilot, "And of Spain?")  # the reloaded chat continues
        assert len(app2.chat.history) == 4
        assert len(app2.store.messages(app2.chat.conv_id)) == 4
        convs.focus()
        convs.highlighted = 0
        await pilot.press("delete")  # delete the open chat: the log empties, the side panel too
        await wait_until(pilot, lambda: convs.option_count == 0 and not app2.query(AssistantMessage))
        assert app2.chat.conv_id is None and app2.store.conversations() == []


async def test_regenerate_replaces_the_last_answer(engine, home):
    """ctrl+r: the last answer leaves the log, the history and the saved chat, and a new one takes its place;
    with nothing answered yet, or while answering, nothing is sent."""
    app = ChatApp(engine, max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not app.query(AssistantMessage) and app.chat.gen_id == 0  # nothing to answer again
        await ask(pilot, REPEAT)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.chat.gen_id == 2 and not app.generating)
        await pilot.pause()
        answers = app.query(AssistantMessage)
        assert len(answers) == 1 and len(app.query(UserMessage)) == 1
        new = answers.last().text
        assert new and app.chat.history == [{"role": "user", "content": REPEAT}, {"role": "assistant", "content": new}]
        stored = app.store.messages(app.chat.conv_id)
        assert [(m.role, m.content) for m in stored] == [("user", REPEAT), ("assistant", new)]
        assert stored[-1].stats  # saved with the new answer's stats, as a first answer is


async def test_keys_colour_k_copy_history_and_palette(engine):
    app = ChatApp(engine, max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, REPEAT)
        assert answer.coloured
        await pilot.press("ctrl+t")
        assert not answer.coloured and answer.has_class("-coloured") is False
        await pilot.press("ctrl+k")
        assert engine.controller.k == 6 and "k      6 fixed" in panel(app) and "speculation ON" in panel(app)
        await pilot.press("ctrl+y")
        assert app.clipboard == app.chat.last_answer
        await pilot.press("ctrl+c")  # nothing to stop: a hint, the app keeps running (twice quits: test_signals)
        assert app.is_running
        await pilot.press("up")
        assert app.query_one("#prompt").value == REPEAT
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {"New chat", "Regenerate", "Speculation: on (now)", "Speculation: off", "Change draft length",
                "Draft length k=2", "Toggle token colouring", "Copy last answer", "Stop generation"} <= titles
        assert "Speculation: auto" not in titles  # this engine has no adaptive controller
        await app.run_action("spec('off')")  # what the palette entry runs
        assert "speculation OFF" in panel(app)
        footer_keys = {b.key for b in app.BINDINGS if getattr(b, "show", True)}
        assert {"ctrl+n", "ctrl+r", "ctrl+s", "ctrl+k", "ctrl+t", "ctrl+y", "ctrl+q"} <= footer_keys


async def test_loading_in_the_app(smollm2_path):
    config = EngineConfig(model=str(smollm2_path), draft="lookup", n_ctx=512, threads=THREADS)
    app = ChatApp(config=config, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine is not None)
        await pilot.pause()
        assert not isinstance(app.screen, LoadingScreen)
        assert "speculation AUTO" in panel(app) and footer_spec(app) == "Spec: auto"  # the loader's default
        await pilot.press("ctrl+k")  # pin k: speculation forced on ...
        assert "k      1 fixed" in panel(app) and "speculation ON" in panel(app)
        for _ in range(len(K_STEPS)):  # ... and cycle back to auto
            await pilot.press("ctrl+k")
        assert "speculation AUTO" in panel(app) and app.engine.controller is app.controls.adaptive
        for want in ("ON", "OFF", "AUTO"):  # ctrl+s: auto -> on -> off -> auto
            await pilot.press("ctrl+s")
            assert f"speculation {want}" in panel(app) and footer_spec(app) == f"Spec: {want.lower()}"
        answer = await ask(pilot, "Hi")
        assert answer.text.strip()
        mode = app.chat.answer.mode  # whatever the controller did, the labels say the same thing
        assert f"mode   {mode}" in panel(app) and (f"{mode}:" in answer.meta or answer.meta.endswith(mode))


@pytest.mark.parametrize("which", ["missing", "incompatible"])
async def test_load_errors_show_in_the_app(which, tmp_path, smollm2_path, request):
    if which == "missing":
        config = EngineConfig(model=str(tmp_path / "nope.gguf"))
    else:
        config = EngineConfig(model=str(smollm2_path), draft=str(request.getfixturevalue("gemma_path")))
    app = ChatApp(config=config)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed)
        error = app.screen.failed
        assert "Traceback" not in error
        assert ("nope.gguf" in error) if which == "missing" else ("cannot draft" in error)
        assert app.load_error.exit_code == 2
        await pilot.press("q")


async def test_request_errors_show_in_the_chat(engine, monkeypatch):
    def no_template(messages):
        raise ChatTemplateError("smollm2 has no chat template in its GGUF metadata; use an instruct model")

    app = ChatApp(engine, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        monkeypatch.setattr(engine, "chat_prompt", no_template)
        failed = await ask(pilot, "Hello?")
        assert failed.has_class("-error") and failed.meta.startswith("error: smollm2 has no chat template")
        assert app.chat.history == []  # the failed prompt is not carried into the next one
        gen = app.chat.gen_id
        await pilot.press("ctrl+r")  # a failed answer is no answer to regenerate
        await pilot.pause()
        assert app.chat.gen_id == gen and failed in app.query(AssistantMessage)
        monkeypatch.undo()
        assert (await ask(pilot, "Hello?")).text.strip()
