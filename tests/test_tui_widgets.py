"""TUI parts alone: widgets in a tiny host App with scripted data, the SQLite store, the update batcher, the
fold of updates into `AnswerStats`, the speculation controls on a stand-in engine, and the wording helpers.
No model is loaded here."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Markdown, Sparkline

from localspec.engine.engine import Chunk
from localspec.engine.stats import Stats
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.types import ControllerState, Step
from localspec.tui.answer import AnswerStats, cleared, ended, fold, reloaded
from localspec.tui.controls import AUTO, K_STEPS, OFF, ON, SpecControls, SpecStatus
from localspec.tui.palette import chat_commands
from localspec.tui.screens.loading import LoadingScreen
from localspec.tui.store import ChatStore
from localspec.tui.stream import Batcher, Segment, Update, accepted_spans, from_spans, split_accepted
from localspec.tui.summary import answer_record, meta_line, stats_from_dict
from localspec.tui.widgets.chat_message import ACCEPTED_STYLE, AssistantMessage
from localspec.tui.widgets.conversation_list import ConversationList
from localspec.tui.widgets.prompt_input import PromptInput
from localspec.tui.widgets.stats_panel import StatsPanel, lines
from localspec.tuning.controller import Adaptive
from localspec.tuning.fixed import FixedK
from localspec.tuning.threads import ThreadChange, ThreadState

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
        answer = AnswerStats(stats=STATS, mode="spec", k=4, tps_now=187.5, done_draft_n=120,
                             done_accepted=60, tps_history=(150.0, 187.5), acc_history=(0.5, 1.0, 0.75))
        on = SpecStatus(ON, (ON, OFF), "lookup", "4", 4)
        panel.show(answer, on)
        await pilot.pause()
        text = panel.text()
        for want in ("speculation ON", "lookup: always drafts 4 tokens a round", "mode   spec · drafter lookup",
                     "k      4 fixed · answer 4", "187.5 now", "200.0 message", "75% (60/80) msg",
                     "50% (60/120) session", "2.50 tok/pass", "ttft   42 ms", "tokens 100 (prompt 30, cached 10)"):
            assert want in text, want
        assert str(panel.query_one("#tps-now").render()).strip() == "tok/s  187.5 now"  # what the screen shows
        assert list(panel.query_one("#acc-spark", Sparkline).data) == [0.5, 1.0, 0.75]
        assert panel.has_class("-on")
        panel.show(replace(answer, live=True), on)  # the answer being written counts for the session
        assert "60% (120/200) session" in panel.text()
        panel.show(replace(answer, mode="plain", k=0), replace(on, setting=OFF, label="–", k_now=0))
        await pilot.pause()
        text = panel.text()
        assert panel.has_class("-off") and "speculation OFF" in text and "mode   plain" in text
        assert "k      – (speculation off)" in text and "switched off" in text
        why = "lookup: it would be 20 % slower here — drafts accepted 35 %, verifying 5 tokens costs 1.7×"
        panel.show(replace(answer, mode="auto-off", k=0), SpecStatus(AUTO, (AUTO, ON, OFF), "lookup", AUTO, 0, why))
        await pilot.pause()
        text = panel.text()
        assert panel.has_class("-off") and "speculation AUTO-OFF" in text and f"off now: {why}" in text
        assert "k      auto · now off · answer –" in text and "mode   auto-off" in text
        panel.show(answer, SpecStatus(AUTO, (AUTO, ON, OFF), "lookup", AUTO, 6))
        await pilot.pause()
        assert panel.has_class("-on") and "speculation AUTO\n" in panel.text()
        assert "k      auto · now 6 · answer 4" in panel.text()
        model_off = "model: it would be 40 % slower here — drafts accepted 20 %"
        panel.show(answer, SpecStatus(AUTO, (AUTO, ON, OFF), "lookup+smollm2", AUTO, 6, None, (model_off,)))
        assert f"lookup+smollm2: drafting; off now: {model_off}" in panel.text()


def test_stats_panel_shows_thread_counts_and_why_they_changed():
    calibrated = ThreadState(threads=2, threads_batch=2, threads_draft=None, pinned=False)
    text = "\n".join(lines(AnswerStats(), SpecStatus(), calibrated).values())
    assert "threads 2 (batch 2)" in text and "as calibrated at load" in text
    busy = ThreadChange(12.5, "target", 2, 1, "machine busy: 1 thread is 1.8× faster than 2")
    text = "\n".join(lines(AnswerStats(), SpecStatus(), replace(calibrated, threads=1, changes=(busy,))).values())
    assert "threads 1 (batch 2)" in text and "target 2 -> 1: machine busy: 1 thread is 1.8× faster than 2" in text
    pinned = ThreadState(threads=1, threads_batch=1, threads_draft=1, pinned=True)
    assert lines(AnswerStats(), SpecStatus(), pinned)["threads-why"] == "pinned (--threads)"
    assert lines(AnswerStats(), SpecStatus())["threads"] == "threads –"


def test_stats_lines_before_any_round():
    text = "\n".join(lines(AnswerStats(), SpecStatus()).values())
    assert "len    –" in text and "ttft   –" in text and "accept –" in text and "mode   –" in text
    assert "no drafter loaded" in text


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

def test_meta_line_says_what_happened_in_the_answer():
    d = STATS.to_dict() | {"mode": "spec", "drafter": "lookup", "k": 4, "finish": "cancelled"}
    line = meta_line(d)
    assert "100 tok" in line and "200 tok/s" in line and "accepted 60/80 (75%)" in line
    assert "spec: lookup k=4" in line and line.endswith("cancelled")
    assert meta_line({"n_generated": 3, "mode": "plain", "drafter": "none"}).endswith("· plain")
    assert meta_line({"mode": "plain", "drafter": "lookup"}).endswith("plain: lookup drafted nothing")
    why = "lookup: it would be 20 % slower here — drafts accepted 35 %, verifying 5 tokens costs 1.7× (α 0.35)"
    line = meta_line({"mode": "auto-off", "drafter": "lookup", "k": 0, "spec_disabled_reason": why})
    assert line.endswith("auto-off: lookup: it would be 20 % slower here") and "k=" not in line


# -- the fold: updates -> AnswerStats ------------------------------------------------------------------------

def ctl_state(k_chosen: dict[int, int], *, off: str | None = None, k_now: int = 4) -> ControllerState:
    return ControllerState(True, k_chosen, {}, (), {}, {}, {}, off, label="auto", k_now=0 if off else k_now)


def update(stats: Stats, *, controller=None, k_chosen=None, finish=None, tps=100.0, acc=(0.5,)) -> Update:
    return Update((Segment("x", False),), stats, "spec" if stats.draft_n else "plain", 2 if stats.draft_n else 0,
                  tps, acc, finish, controller, k_chosen or {})


def test_fold_names_the_answer_as_run_json_does():
    spec = replace(STATS, draft_n=10, draft_n_accepted=5)
    a = fold(AnswerStats(), update(spec, controller=ctl_state({6: 30, 4: 3}), k_chosen={6: 3, 4: 5}))
    assert (a.mode, a.k, a.live) == ("spec", 4, True)  # k: the γ chosen in most rounds of *this* answer
    assert (a.session_draft_n, a.session_accepted) == (10, 5)  # the live answer counts for the session
    a = fold(a, update(replace(spec, draft_n=20, draft_n_accepted=15), controller=ctl_state({6: 40}),
                       k_chosen={6: 13, 4: 5}, finish="stop"))
    assert (a.mode, a.k, a.live, a.finish) == ("spec", 6, False, "stop")
    assert (a.done_draft_n, a.done_accepted, a.session_draft_n) == (20, 15, 20)
    assert a.tps_history == (100.0, 100.0) and a.acc_history == (0.5, 0.5)
    counts = ThreadState(threads=2, threads_batch=2, threads_draft=None, pinned=False)
    assert fold(a, replace(update(spec), threads=counts)).threads is counts
    assert fold(fold(a, replace(update(spec), threads=counts)), update(spec)).threads is counts  # kept until the next
    # the next answer: the controller switched drafting off before it began and never chose to draft
    plain = replace(STATS, draft_n=0, draft_n_accepted=0, drafted_at=(), accepted_at=(), by_source={})
    why = "lookup: it would be 20 % slower here — drafts accepted 35 %"
    b = fold(a, update(plain, controller=ctl_state({0: 9}, off=why), k_chosen={0: 9}, finish="stop", acc=()))
    assert (b.mode, b.k, b.off_reason) == ("auto-off", 0, why)
    assert b.done_draft_n == 20  # nothing drafted: the session rate stays
    record = answer_record(b, drafter="lookup", accepted_spans=[])
    assert (record["mode"], record["drafter"], record["k"], record["spec_disabled_reason"]) == ("auto-off", "lookup", 0,
                                                                                               why)
    # drafting on, the controller chose γ = 4, but the drafter found nothing to propose: plain, not auto-off
    c = fold(a, update(plain, controller=ctl_state({4: 9}), k_chosen={4: 9}, finish="stop", acc=()))
    assert (c.mode, c.k) == ("plain", 0)  # k: what was drafted, as run and the server report it
    # speculation off: no controller in the request
    d = fold(a, update(plain, finish="length", acc=()))
    assert (d.mode, d.k, d.controller) == ("plain", 0, None)
    assert answer_record(d, drafter="lookup", accepted_spans=[])["drafter"] == "none"


def test_answer_stats_across_chats():
    a = fold(AnswerStats(), update(replace(STATS, draft_n=10, draft_n_accepted=5), controller=ctl_state({4: 1}),
                                   k_chosen={4: 1}))
    failed = ended(a)  # the worker let go without a final update (an error mid-answer): its drafts still count
    assert not failed.live and failed.done_draft_n == 10 and ended(failed) == failed
    new = cleared(failed)
    assert (new.stats, new.mode, new.k, new.tps_now) == (Stats(), "", 0, 0.0)
    assert new.done_draft_n == 10 and new.tps_history == a.tps_history  # the session and sparklines stay
    saved = STATS.to_dict() | {"mode": "spec", "drafter": "lookup", "k": 6, "finish": "stop"}
    r = reloaded(new, stats_from_dict(saved), saved)
    assert (r.stats, r.mode, r.k, r.live) == (STATS, "spec", 6, False)
    assert reloaded(new, STATS, {"mode": "spec", "k": "auto"}).k == 0  # records written before k was a number


def test_since_counts_this_request_only():
    before, now = ctl_state({4: 10, 0: 2}), ctl_state({4: 13, 6: 2, 0: 2})
    assert now.since(before).k_chosen == {4: 3, 6: 2} and now.since(None).k_chosen == now.k_chosen


# -- the controls: the one place the chat changes the engine -------------------------------------------------

def adaptive_engine():
    """A stand-in engine (the controls read drafter, drafter_name and controller) with a real Adaptive controller
    that has seen rejected drafts until it switched speculation off."""
    ctl = Adaptive(sources=("lookup",), c={"lookup": 0.0}, v=[1.0 + 0.5 * d for d in range(9)], learn_costs=False)
    for _ in range(40):
        ctl.choose_k()
        ctl.observe(Step(tokens=(1,), drafted=4, accepted=0, t_draft=0.0, t_verify=0.01, source="lookup"))
    return SimpleNamespace(drafter=PromptLookup(), drafter_name="lookup", controller=ctl)


def test_controls_cycle_auto_on_off():
    engine = adaptive_engine()
    adaptive = engine.controller
    controls = SpecControls(engine)
    assert (controls.setting, controls.choices, controls.drafting) == (AUTO, (AUTO, ON, OFF), True)
    st = controls.status(controls.snapshot())
    assert st.auto_off and st.off_reason.startswith("lookup: it would be") and st.k_now == 0
    # auto -> on: forced on, at the γ the adaptive controller chose most (its latest snapshot says which)
    assert controls.cycle(ctl_state({6: 5, 3: 1}, off="off")) == "speculation on: always draft k = 6"
    assert controls.setting == ON and isinstance(engine.controller, FixedK) and engine.controller.k == 6
    st = controls.status(controls.snapshot())
    assert (st.label, st.k_now, st.auto_off) == ("6", 6, False)
    assert "off" in controls.cycle() and controls.setting == OFF and not controls.drafting
    assert controls.status(None) == SpecStatus(OFF, (AUTO, ON, OFF), "lookup")
    controls.cycle()  # off -> auto: the session's adaptive controller again, with what it learned
    assert controls.setting == AUTO and engine.controller is adaptive
    controls.set(ON)
    assert engine.controller.k == 6  # "on" remembers its γ


def test_controls_status_names_a_source_the_controller_stopped():
    ctl = Adaptive(sources=("lookup", "model"), c={"lookup": 0.0, "model": 5.0})  # the model drafter cannot pay
    controls = SpecControls(SimpleNamespace(drafter=PromptLookup(), drafter_name="lookup+m", controller=ctl))
    st = controls.status(controls.snapshot())
    assert not st.auto_off and st.k_now > 0 and len(st.sources_off) == 1
    assert st.sources_off[0].startswith("model: it would be")


def test_controls_draft_length():
    engine = adaptive_engine()
    controls = SpecControls(engine)
    assert "k = 1" in controls.cycle_k() and (controls.setting, engine.controller.k) == (ON, 1)  # auto -> 1
    fixed = engine.controller
    for want in (2, 3, 4, 6, 8):
        controls.cycle_k()
        assert engine.controller is fixed and fixed.k == want  # live: a running answer follows next round
    controls.cycle_k()
    assert controls.setting == AUTO and engine.controller is controls.adaptive  # 8 -> auto
    controls.set(OFF)
    controls.set_k(3)  # picking a length means drafting it
    assert (controls.setting, fixed.k) == (ON, 3)
    assert "at least 1" in controls.set_k(0)


def test_controls_without_adaptive_or_drafter():
    fixed = FixedK(4)
    engine = SimpleNamespace(drafter=PromptLookup(), drafter_name="lookup", controller=fixed)
    controls = SpecControls(engine)
    assert (controls.setting, controls.choices) == (ON, (ON, OFF))
    controls.cycle()
    controls.cycle()
    assert controls.setting == ON and engine.controller is fixed  # on <-> off, never an "auto" that is not there
    assert "adaptive" in controls.set(AUTO) and controls.setting == ON
    for _ in K_STEPS:
        controls.cycle_k()
    assert fixed.k == 4  # 4 -> 6 -> 8 -> 1 -> 2 -> 3 -> 4
    plain = SpecControls(SimpleNamespace(drafter=None, drafter_name="none", controller=FixedK(0)))
    assert (plain.setting, plain.choices, plain.drafting) == (OFF, (OFF,), False)
    assert "no drafter" in plain.cycle() and "no drafter" in plain.set_k(4) and plain.snapshot() is None


def test_palette_entries_are_data():
    controls = SpecControls(adaptive_engine())
    commands = list(chat_commands(controls))
    titles = [c.title for c in commands]
    assert {"Speculation: auto (now)", "Speculation: on", "Speculation: off", "Change draft length",
            "Draft length k=4", "New chat", "Copy last answer"} <= set(titles)
    assert next(c for c in commands if c.title == "Speculation: on").action == "spec('on')"
    assert not any("Speculation" in t or "Draft" in t for t in (c.title for c in chat_commands(None)))


# -- the command ---------------------------------------------------------------------------------------------

def test_chat_command_help_and_pair_errors():
    from click.testing import CliRunner

    from localspec.cli import main

    r = CliRunner().invoke(main, ["chat", "--help"])
    assert r.exit_code == 0 and "ctrl+s speculation auto/on/off" in r.output and "--pair NAME" in r.output
    r = CliRunner().invoke(main, ["chat", "--pair", "no-such-pair"])
    assert r.exit_code == 2 and r.output.startswith("error: no pair named 'no-such-pair'")
    assert "Traceback" not in r.output and "smollm2-135m-lookup" in r.output
    r = CliRunner().invoke(main, ["chat", "--pair", "smollm2-135m-lookup", "--model", "x"])
    assert r.exit_code == 2 and "choose one of --model and --pair" in r.output
