"""Switching models in the running chat (ctrl+o): the picker lists the registry, marks what is on disk and each
model's drafter, and loads the chosen one without restarting the app; the conversation goes on with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localspec.engine.loader import EngineConfig
from localspec.tui.app import ChatApp
from localspec.tui.screens.loading import LoadingScreen
from localspec.tui.screens.models import DataTable, ModelPicker
from localspec.tui.widgets.chat_message import AssistantMessage

pytestmark = pytest.mark.slow
SIZE = (140, 40)


@pytest.fixture
def registry(tmp_path, monkeypatch, smollm2_path, smollm2_f16_path, gemma_path):
    """A user overlay with three local models (the F16 one paired with the Q4_1 one as its drafter) and one hub
    model that is not on disk."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    local = overlay({"small": smollm2_path, "big": smollm2_f16_path, "other": gemma_path},
                    {"big-small": ("big", "small", 3)})
    (tmp_path / "models.toml").write_text(local + '[models.far-away]\nhf = "nobody/not-here-GGUF"\nquant = "Q4_K_M"\n')
    return tmp_path


def overlay(paths: dict[str, Path], pairs: dict[str, tuple[str, str, int | None]]) -> str:
    """models.toml text for local models (name -> file) and pairs (name -> target, drafter, k or None)."""
    lines = [f'[models.{name}]\npath = "{path}"' for name, path in paths.items()]
    lines += [f'[pairs.{name}]\ntarget = "{t}"\ndrafter = "{d}"' + (f"\nk = {k}" if k else "")
              for name, (t, d, k) in pairs.items()]
    return "\n" + "\n".join(lines) + "\n"


async def wait_until(pilot, cond, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting for the app"
        await pilot.pause(0.05)


def picker_ready(screen: object) -> bool:
    """The picker is up and has listed every model: it fills its table once mounted, a moment after it is the
    app's screen (on a busy machine, long enough for a test to read an empty table)."""
    return (isinstance(screen, ModelPicker) and bool(screen.query(DataTable))
            and screen.query_one(DataTable).row_count == len(screen.models))


def rows(picker: ModelPicker) -> dict[str, list[str]]:
    table = picker.query_one(DataTable)
    return {str(key.value): [str(c) for c in table.get_row(key)] for key in table.rows}


async def pick(pilot, name: str) -> None:
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
        await wait_until(pilot, lambda: picker_ready(app.screen))
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
    more = overlay({"broken": tmp_path / "broken.gguf", "mismatched": smollm2_path},
                   {"mismatched-other": ("mismatched", "other", None)})
    (registry / "models.toml").write_text((registry / "models.toml").read_text() + more)
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all" * 10)
    app = ChatApp(config=EngineConfig(model="small", n_ctx=512, threads=1), max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine is not None)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: picker_ready(app.screen))
        assert rows(app.screen)["broken"][2].startswith("damaged: ")
        await pick(pilot, "broken")
        assert isinstance(app.screen, ModelPicker)
        await pick(pilot, "mismatched")
        await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen) and app.screen.failed)
        assert "Traceback" not in app.screen.failed and "cannot draft" in app.screen.failed, app.screen.failed
        await pilot.press("escape")
        await wait_until(pilot, lambda: picker_ready(app.screen))
        await pick(pilot, "small")
        await wait_until(pilot, lambda: app.engine is not None and app.engine.name == "small")
