"""TUI parts alone: widgets in a tiny host App with scripted data, the SQLite store, the update batcher,
and the wording helpers. No model is loaded here."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Markdown, Sparkline

from localspec.controller import FixedK
from localspec.session import Chunk
from localspec.speculative import Step
from localspec.stats import Stats
from localspec.tui.screens.loading import LoadingScreen
from localspec.tui.store import ChatStore
from localspec.tui.stream import Batcher, Segment, accepted_spans, from_spans, split_accepted
from localspec.tui.summary import AUTO, meta_line, next_k, set_draft_length, stats_from_dict
from localspec.tui.widgets.chat_message import ACCEPTED_STYLE, AssistantMessage
from localspec.tui.widgets.conversation_list import ConversationList
from localspec.tui.widgets.prompt_input import PromptInput
from localspec.tui.widgets.stats_panel import StatsPanel, StatsView, lines

STATS = Stats(n_prompt=30, n_cached=10, prompt_ms=100.0, ttft_ms=42.0, n_generated=100, gen_ms=500.0, rounds=40,
              draft_n=80, draft_n_accepted=60, drafted_at=(40, 30), accepted_at=(35, 25),
              by_source={"lookup": (80, 60)})


class Host(App):
    def __init__(self, *widgets) -> None:
        super().__init__()
        self.widgets = widgets
        self.chosen: list[int] = []
        self.deleted: list[int] = []

    def compose(self) -> ComposeResult:
        yield from self.widgets

    def on_conversation_list_chosen(self, msg: ConversationList.Chosen) -> None:
        self.chosen.append(msg.conversation_id)

    def on_conversation_list_deleted(self, msg: ConversationList.Deleted) -> None:
        self.deleted.append(msg.conversation_id)


# -- stats panel ---------------------------------------------------------------------------------------------

async def test_stats_panel_shows_scripted_stats():
    panel = StatsPanel()
    async with Host(panel).run_test(size=(60, 30)) as pilot:
        assert "OFF" in panel.text() and "accept –" in panel.text()
        view = StatsView(stats=STATS, tps_now=187.5, session_draft_n=200, session_accepted=120, drafter="lookup",
                         mode="spec", k=4, k_used=3, spec_on=True, spec_reason="lookup, k=4",
                         tps_history=(150.0, 187.5), acc_history=(0.5, 1.0, 0.75))
        panel.show(view)
        await pilot.pause()
        text = panel.text()
        for want in ("speculation ON", "lookup, k=4", "mode   spec · drafter lookup", "k      4 fixed (last round 3)",
                     "187.5 now", "200.0 message", "75% (60/80) msg", "60% (120/200) session", "2.50 tok/pass",
                     "ttft   42 ms", "tokens 100 (prompt 30, cached 10)"):
            assert want in text, want
        assert str(panel.query_one("#tps-now").render()).strip() == "tok/s  187.5 now"  # what the screen shows
        assert list(panel.query_one("#acc-spark", Sparkline).data) == [0.5, 1.0, 0.75]
        assert panel.has_class("-on")
        panel.show(replace(view, spec_on=False, spec_reason="switched off", mode="plain"))
        await pilot.pause()
        assert panel.has_class("-off") and "speculation OFF" in panel.text() and "mode   plain" in panel.text()
        panel.show(replace(view, auto_off=True, spec_reason="auto-off: lookup: spec 0.56× plain"))
        await pilot.pause()
        assert panel.has_class("-off") and "speculation AUTO-OFF" in panel.text()


def test_stats_lines_before_any_round():
    text = "\n".join(lines(StatsView()).values())
    assert "len    –" in text and "ttft   –" in text and "accept –" in text


# -- messages, input, side panel, loading screen -------------------------------------------------------------

async def test_assistant_message_colours_accepted_drafts_and_toggles_to_markdown():
    msg = AssistantMessage(coloured=True)
    async with Host(msg).run_test() as pilot:
        await msg.add((Segment("The **cat** ", True), Segment("sat", False)))
        await msg.add((Segment(" down.", True),))
        assert msg.text == "The **cat** sat down." and msg.accepted_text == "The **cat**  down."
        spans = [(msg.rich_text().plain[s.start:s.end], s.style) for s in msg.rich_text().spans]
        assert spans == [("The **cat** ", ACCEPTED_STYLE), (" down.", ACCEPTED_STYLE)]
        await msg.set_coloured(False)
        await pilot.pause()
        assert not msg.has_class("-coloured") and msg.query_one(Markdown).source == msg.text
        await msg.add((Segment(" More.", False),))  # streaming into the Markdown face
        await msg.end_stream()
        assert msg.query_one(Markdown).source == msg.text
        msg.set_meta("error: context full", error=True)
        assert msg.has_class("-error") and msg.meta == "error: context full"


async def test_prompt_input_history():
    box = PromptInput(history=["first", "second"])
    async with Host(box).run_test() as pilot:
        box.focus()
        await pilot.press(*"draft")
        await pilot.press("up")
        assert box.value == "second"
        await pilot.press("up", "up")
        assert box.value == "first"
        await pilot.press("down", "down")
        assert box.value == "draft"  # back to what was being typed
        box.remember("third")
        await pilot.press("up")
        assert box.value == "third"


async def test_conversation_list_posts_the_chosen_id(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite")
    a = store.new_conversation("about cats")
    b = store.new_conversation("about dogs")
    store.add_message(a, "user", "hi")  # a is now the most recent
    host = Host(ConversationList())
    async with host.run_test() as pilot:
        convs = host.query_one(ConversationList)
        convs.set_conversations(store.conversations(), current=b)
        assert convs.option_count == 2 and convs.highlighted == 1
        convs.focus()
        convs.highlighted = 0
        await pilot.press("enter")
        await pilot.pause()
        assert host.chosen == [a]
        await pilot.press("down", "delete")
        await pilot.pause()
        assert host.deleted == [b]


async def test_loading_screen_shows_progress_then_the_error():
    class LoadingHost(App):
        def on_mount(self) -> None:
            self.push_screen(LoadingScreen("smollm2-135m"))

    app = LoadingHost()
    async with app.run_test() as pilot:
        screen = app.screen
        screen.progress("resolving smollm2-135m")
        screen.fail("model 'nope' is not in models.toml; run `localspec models list`")
        await pilot.pause()
        assert screen.failed and screen.has_class("-failed")
        assert "error: model 'nope'" in str(screen.query_one("#error").render())
        await pilot.press("q")
    assert app.return_code == 0


# -- store ---------------------------------------------------------------------------------------------------

def test_store_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    store = ChatStore()
    assert store.path == tmp_path / "chats.sqlite"
    c = store.new_conversation("hello", model="smollm2-135m", system="be brief")
    store.add_message(c, "user", "hi")
    d = STATS.to_dict() | {"mode": "spec", "drafter": "lookup", "k": 4, "finish": "stop"}
    store.add_message(c, "assistant", "hello!", stats=d)
    store.close()
    again = ChatStore(tmp_path / "chats.sqlite")
    [conv] = again.conversations()
    assert (conv.title, conv.model, conv.system) == ("hello", "smollm2-135m", "be brief")
    user, answer = again.messages(c)
    assert (user.role, user.content, user.stats) == ("user", "hi", None)
    assert answer.stats["draft_n_accepted"] == 60 and stats_from_dict(answer.stats) == STATS
    assert again.recent_inputs() == ["hi"]
    again.delete(c)
    assert again.conversations() == [] and again.messages(c) == []


# -- batching (the <= 20 repaints/s rule) --------------------------------------------------------------------

def chunk(text: str, tokens: int, drafted: int, accepted: int, finish: str | None = None) -> Chunk:
    step = Step(tokens=tuple(range(tokens)), drafted=drafted, accepted=accepted, t_draft=0.001, t_verify=0.009,
                finish=finish)
    return Chunk(text, step, STATS, finish, "spec" if drafted else "plain")


def test_batcher_folds_rounds_into_one_update_per_interval():
    now = [0.0]
    b = Batcher(interval=0.05, clock=lambda: now[0])
    updates = []
    for i in range(100):  # 100 rounds, 5 ms apart = 0.5 s
        last = i == 99
        b.add(chunk("ab", 2, 2, 1, "length" if last else None), "a")
        if last or b.due():
            updates.append(b.take())
        now[0] += 0.005
    assert len(updates) <= 0.5 / 0.05 + 2  # first and last go out at once, the rest every 50 ms
    assert updates[0].segments == (Segment("a", True), Segment("b", False))  # the first round is not held back
    assert updates[-1].finish == "length"
    assert "".join(u.text for u in updates) == "ab" * 100
    assert sum(len(u.acceptance) for u in updates) == 100 and updates[1].acceptance[0] == 0.5
    assert updates[1].tps_now == pytest.approx(2 / 0.010)


def test_accepted_spans_round_trip():
    segs = (Segment("The ", False), Segment("cat sat", True), Segment(" on", False), Segment(" the mat", True))
    spans = accepted_spans(segs)
    assert spans == [[4, 11], [14, 22]]
    assert from_spans("The cat sat on the mat", spans) == segs
    assert from_spans("plain", []) == (Segment("plain", False),)


def test_split_accepted():
    assert split_accepted("hello world", "hello") == 5
    assert split_accepted("hi", "") == 0
    assert split_accepted("ab", "abc") == 2  # held-back bytes: clip, colouring is display-only


# -- wording -------------------------------------------------------------------------------------------------

def test_meta_line_and_k_choices():
    d = STATS.to_dict() | {"mode": "spec", "drafter": "lookup", "k": 4, "finish": "cancelled"}
    line = meta_line(d)
    assert "100 tok" in line and "200 tok/s" in line and "accepted 60/80 (75%)" in line
    assert "spec: lookup k=4" in line and line.endswith("cancelled")
    assert meta_line({"n_generated": 3, "mode": "plain"}).endswith("plain")
    assert next_k(4, auto=False) == 6 and next_k(8, auto=False) == 1
    assert next_k(8, auto=True) == AUTO and next_k(AUTO, auto=True) == 1


def test_set_draft_length_pins_and_restores():
    class Eng:
        drafter, controller = None, FixedK(4)

    e = Eng()
    assert "k = 6" in set_draft_length(e, 6, None) and e.controller.k == 6
    adaptive = object()
    e.controller = adaptive
    set_draft_length(e, 2, adaptive)
    assert isinstance(e.controller, FixedK) and e.controller.k == 2
    set_draft_length(e, AUTO, adaptive)
    assert e.controller is adaptive
    assert "no adaptive" in set_draft_length(e, AUTO, None)


# -- the command ---------------------------------------------------------------------------------------------

def test_chat_command_help_and_pair_errors():
    from click.testing import CliRunner

    from localspec.cli import main

    r = CliRunner().invoke(main, ["chat", "--help"])
    assert r.exit_code == 0 and "ctrl+s speculation on/off" in r.output and "--pair NAME" in r.output
    r = CliRunner().invoke(main, ["chat", "--pair", "no-such-pair"])
    assert r.exit_code == 2 and r.output.startswith("error: no pair named 'no-such-pair'")
    assert "Traceback" not in r.output and "smollm2-135m-lookup" in r.output
    r = CliRunner().invoke(main, ["chat", "--pair", "smollm2-135m-lookup", "--model", "x"])
    assert r.exit_code == 2 and "choose one of --model and --pair" in r.output


def test_pair_spec_fills_target_drafter_and_k():
    from localspec.commands.chat import pair_spec
    from localspec.loader import EngineSpec

    spec = pair_spec("smollm2-135m-lookup", EngineSpec(), model_given=False)
    assert (spec.model, spec.draft, spec.k) == ("smollm2-135m", "lookup", 4)
    assert pair_spec("smollm2-135m-lookup", EngineSpec(draft="none", k=2), model_given=False).draft == "none"
