"""`<think>` blocks split from the answer as llama-server's --reasoning-format does it: whole and streamed a
character at a time (the pieces add up to the whole split), with the block opened by the model or by the template
(DeepSeek R1's, tests/templates/), and left in the content under `none`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.engine.reasoning import ReasoningStream, opens_thinking, split_reasoning
from localspec.engine.template import render_chat

TEMPLATES = Path(__file__).parent / "templates"
ANSWER = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nIt is 4."


def streamed(text: str, fmt: str = "auto", started: bool = False) -> tuple[str, str]:
    s = ReasoningStream(fmt, started=started)
    pieces = [s.push(ch) for ch in text] + [s.finish()]
    return "".join(r for r, _ in pieces), "".join(c for _, c in pieces)


@pytest.mark.parametrize("fmt", ["auto", "deepseek"])
def test_think_block_becomes_reasoning(fmt: str) -> None:
    expected = ("The user wants 2+2. That is 4.", "It is 4.")
    assert split_reasoning(ANSWER, fmt) == expected
    assert streamed(ANSWER, fmt) == expected


def test_none_leaves_the_block_in_the_content() -> None:
    assert split_reasoning(ANSWER, "none") == ("", ANSWER)
    assert streamed(ANSWER, "none") == ("", ANSWER)


@pytest.mark.parametrize("text", ["No thinking here.", "<thin is not a tag", "a <think> in the middle"])
def test_text_without_a_leading_block_is_all_content(text: str) -> None:
    assert split_reasoning(text) == ("", text)
    assert streamed(text) == ("", text)


def test_unfinished_thinking_is_all_reasoning() -> None:
    text = "<think>\nStill going, no end tag"
    assert split_reasoning(text) == ("Still going, no end tag", "")
    assert streamed(text) == ("Still going, no end tag", "")


def test_a_tag_being_written_is_held_back() -> None:
    s = ReasoningStream()
    assert s.push("<thi") == ("", "")
    assert s.push("nk>Hmm</th") == ("Hmm", "")
    assert s.push("ink>Yes") == ("", "Yes")


def test_a_template_that_opens_the_block() -> None:
    """DeepSeek R1's generation prompt ends inside `<think>`: the answer starts as reasoning, up to `</think>`."""
    tpl = (TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text()
    msgs = [{"role": "user", "content": "2+2?"}]
    prompt = render_chat(tpl, msgs, bos="<s>", enable_thinking=True)
    assert opens_thinking(prompt)
    assert not opens_thinking(render_chat(tpl, msgs, bos="<s>", enable_thinking=False))
    answer = "Two and two.\n</think>\n\nIt is 4."
    assert split_reasoning(answer, started=True) == ("Two and two.", "It is 4.")
    assert streamed(answer, started=True) == ("Two and two.", "It is 4.")
