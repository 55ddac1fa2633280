"""An assistant prefill given as several text parts is continued as llama-server continues it: the parts joined
by a blank line (llama.cpp's test_chat_template_assistant_prefill, on the same Llama 3.1 template). No model is
loaded: the engine's model is a fake whose tokens are the prompt's characters."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeModel

from localspec.engine.engine import Engine
from localspec.server.protocols import responses_request
from localspec.server.protocols.anthropic import routes as anthropic
from localspec.server.protocols.anthropic.convert import MessagesRequest
from localspec.server.request.chat import chat_prompt, chat_text, openai_plan, prefill_text
from localspec.server.request.schemas import OAIChatRequest

LLAMA_31 = (Path(__file__).parent / "templates" / "llama-3.1.jinja").read_text()
ASKED = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
TURN = "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>" \
       "<|start_header_id|>assistant<|end_header_id|>\n\n"


class Target(FakeModel):
    """A model with no BOS or EOS whose tokens are the prompt's characters."""

    bos = eos = -1
    path = Path("fake.gguf")

    def metadata(self) -> dict[str, str]:
        return {}

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]


def prompt(body: dict[str, Any]) -> str:
    """The prompt an OpenAI chat request renders to on the Llama 3.1 template."""
    e = Engine(Target(lambda c: 1), name="fake", chat_template=LLAMA_31)
    return chat_prompt(e, openai_plan(e, OAIChatRequest.model_validate(body), "auto"))


@pytest.mark.parametrize("prefill,continued", [
    ("Whill", "Whill"),
    ([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}], "Wh\n\nill"),
])
def test_a_prefill_of_parts_is_joined_by_a_blank_line(prefill: Any, continued: str):
    messages = [*ASKED, {"role": "assistant", "content": prefill}]
    assert prompt({"messages": messages}).endswith(TURN + continued)
    assert prompt({"messages": messages, "continue_final_message": True,
                   "add_generation_prompt": False}).endswith(TURN + continued)


def test_the_separator_comes_only_after_some_text():
    """llama.cpp's render_content: an empty first part adds no separator; later empty parts still do."""
    parts = [{"type": "text", "text": ""}, {"type": "text", "text": "a"}, {"type": "text", "text": ""},
             {"type": "text", "text": "b"}]
    assert prefill_text(parts) == "a\n\n\n\nb"
    assert prefill_text([{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]) == "a\n\nb"
    assert prefill_text(None) == "" and prefill_text("x") == "x"


def test_a_finished_assistant_turn_keeps_its_parts_joined_as_before():
    """Only the continued message takes the blank line; a message the template renders keeps chat_text."""
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    messages = [*ASKED, {"role": "assistant", "content": parts}]
    assert chat_text(parts) == "Whill"
    assert "Whill<|eot_id|>" in prompt({"messages": messages, "continue_final_message": False})


def test_an_anthropic_prefill_of_text_blocks_is_joined_the_same_way():
    """/v1/messages continues a final assistant message; its text blocks join as the OpenAI route's parts do."""
    e = Engine(Target(lambda c: 1), name="fake", chat_template=LLAMA_31)
    state: Any = SimpleNamespace(engine=e, config=SimpleNamespace(reasoning_format="auto"))
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "system": "Book", "messages": [
        {"role": "user", "content": "What is the best book"},
        {"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]}]})
    assert anthropic.prepare(state, req).prompt.endswith(TURN + "Wh\n\nill")


def test_a_responses_input_that_ends_with_the_assistants_text_is_continued():
    """/v1/responses: a final assistant message item is continued, as llama-server continues it once it has made
    the input a chat request; its output_text parts, and those of assistant items right before it (one message
    there), join by a blank line. An input that ends with a call or its output opens a new turn."""
    e = Engine(Target(lambda c: 1), name="fake", chat_template=LLAMA_31)
    state: Any = SimpleNamespace(engine=e, config=SimpleNamespace(reasoning_format="auto"))

    def text(*items: dict[str, Any]) -> str:
        body = {"model": "m", "instructions": "Book",
                "input": [{"role": "user", "content": "What is the best book"}, *items]}
        return responses_request.setup(state, responses_request.ResponsesRequest.model_validate(body))[1]

    said = [{"type": "output_text", "text": "Wh"}, {"type": "output_text", "text": "ill"}]
    assert text({"type": "message", "role": "assistant", "content": said}).endswith(TURN + "Wh\n\nill")
    assert text({"type": "message", "role": "assistant", "content": said[:1]},
                {"type": "message", "role": "assistant", "content": said[1:]}).endswith(TURN + "Wh\n\nill")
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    assert not text({"type": "message", "role": "assistant", "content": said}, call).endswith("ill")
