"""Regenerate docs/chat.svg: a real chat, captured mid-answer (`python scripts/docs/screenshot_chat.py [OUT_DIR]`).

Uses the embedded SmolLM2-135M with prompt lookup at a fixed k=4, so the accepted drafts show in colour.
Convert for the README with `rsvg-convert -z 0.8` after adding xml:space="preserve" to the <svg> element
(rsvg otherwise drops leading spaces of text runs).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile

PROMPTS = ("Write a haiku about the sea.", None,  # None: ctrl+n, a new chat
           "Write a Python function that returns the squares of a list of numbers.",
           "Now write the same function again with type hints and a docstring, then explain each line in detail.")


async def capture(out_dir: str, *, after_tokens: int = 60) -> str:
    from localspec.engine.loader import EngineConfig, load_engine
    from localspec.tui.app import ChatApp

    engine = load_engine(EngineConfig(threads=1, n_ctx=2048, adaptive=False), log=print)
    app = ChatApp(engine, max_tokens=400)
    async with app.run_test(size=(150, 44)) as pilot:
        async def wait(cond) -> None:
            while not cond():
                await pilot.pause(0.02)

        for i, text in enumerate(PROMPTS):
            if text is None:
                await pilot.press("ctrl+n")
                continue
            g = app.chat.gen_id
            await pilot.press(*text, "enter")
            await wait(lambda: app.chat.gen_id > g)
            if i < len(PROMPTS) - 1:
                await wait(lambda: not app.generating)
        await wait(lambda: (app.chat.answer.live and app.chat.answer.stats.n_generated >= after_tokens)
                   or not app.generating)
        path = app.save_screenshot("chat.svg", path=out_dir)
        await pilot.press("escape")
        await wait(lambda: not app.generating)
    engine.close()
    return path


if __name__ == "__main__":
    os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="localspec-shot-")  # an empty side panel to start
    print(asyncio.run(capture(sys.argv[1] if len(sys.argv) > 1 else "docs")))
