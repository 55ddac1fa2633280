"""Switching models in the running chat (ctrl+o): the picker lists the registry, marks what is on disk and each
model's drafter, and loads the chosen one without restarting the app; the conversation goes on with it."""

from __future__ import annotations

import time

import pytest

from localspec.engine.loader import EngineConfig
from localspec.tui.app import ChatApp
from localspec.tui.screens.loading import LoadingScreen
from localspec.tui.screens.models import ModelPicker
from localspec.tui.widgets.chat_message import AssistantMessage

pytestmark = pytest.mark.slow
SIZE = (140, 40)


@pytest.fixture
def registry(tmp_path, monkeypatch, smollm2_path, smollm2_f16_path, gemma_path):
    """A user overlay with three local models (the F16 one paired with the Q4_1 one as its drafter) and one hub
    model that is not on disk."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "models.toml").write_text(f"""
[models.small]
path = "{smollm2_path}"
[models.big]
path = "{smollm2_f16_path}"
[models.other]
path = "{gemma_path}"
[models.far-away]
hf = "nobody/not-here-GGUF"
quant = "Q4_K_M"
[pairs.big-small]
target = "big"
drafter = "small"
k = 3
""")
    return tmp_path


async def wait_until(pilot, cond, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting for the app"
        await pilot.pause(0.05)


def rows(picker: ModelPicker) -> dict[str, list[str]]:
    from localspec.tui.screens.models import DataTable

    table = picker.query_one(DataTable)
    return {str(key.value): [str(c) for c in table.get_row(key)] for key in table.rows}


async def pick(pilot, name: str) -> None:
    from localspec.tui.screens.models import DataTable

    picker = pilot.app.screen
    table = picker.query_one(DataTable)
    table.move_cursor(row=list(picker.models).index(name))
    await pilot.press("enter")


async def test_switching_models_without_restarting(registry):
    app = ChatApp(config=EngineConfig(model="small", n_ctx=512, threads=1), max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine is not None)
        first = app.engine
        assert first.name == "small"
        closed: list[bool] = []
        close = first.close
        first.close = lambda: (closed.append(True), close())[1]  # type: ignore[method-assign]
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        listed = rows(app.screen)
        assert listed["small"][0] == "●" and listed["small"][2] == "on disk"
        assert listed["big"][2] == "on disk" and listed["big"][5] == "small"  # its pair's drafter
        assert listed["other"][2] == "on disk" and listed["other"][5] == "lookup"
        assert listed["far-away"][2] == "localspec models pull far-away"

        await pick(pilot, "far-away")  # not on disk: the picker stays and says what to run
        assert isinstance(app.screen, ModelPicker) and app.engine is first

        await pick(pilot, "big")
        await wait_until(pilot, lambda: app.engine is not None and app.engine.name == "big")
        assert not isinstance(app.screen, (ModelPicker, LoadingScreen))
        assert "big" in app.sub_title and app.engine.drafter_name == "small"  # the pair loads with its drafter
        assert closed == [True]  # the old model was closed before the new one loaded
        await pilot.press(*"Hi")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.query(AssistantMessage)) == 1)
        await wait_until(pilot, lambda: not app.generating)
        await pilot.pause()
        answer = app.query(AssistantMessage).last()
        assert app.chat.answer.stats.n_generated > 0, (answer.text, answer.meta)  # the new model answers


async def test_a_failed_switch_goes_back_to_the_picker(registry, tmp_path, smollm2_path):
    """A damaged file is marked in the list and not loaded; a pair that fails at load (a drafter with another
    tokenizer) shows the one-line error, and Esc goes back to the picker."""
    (registry / "models.toml").write_text((registry / "models.toml").read_text() + f"""
[models.broken]
path = "{tmp_path / 'broken.gguf'}"
[models.mismatched]
path = "{smollm2_path}"
[pairs.mismatched-other]
target = "mismatched"
drafter = "other"
""")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all" * 10)
    app = ChatApp(config=EngineConfig(model="small", n_ctx=512, threads=1), max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine is not None)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        assert rows(app.screen)["broken"][2].startswith("damaged: ")
        await pick(pilot, "broken")
        assert isinstance(app.screen, ModelPicker)
        await pick(pilot, "mismatched")
        await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed)
        assert "Traceback" not in app.screen.failed and "cannot draft" in app.screen.failed, app.screen.failed
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        await pick(pilot, "small")
        await wait_until(pilot, lambda: app.engine is not None and app.engine.name == "small")
