"""Chat templates rendered as llama.cpp's renderer renders them (engine/template.py), on llama.cpp's own copies of
real templates (tests/templates/, from the vendored llama.cpp's models/templates/ that its test_template.py uses):
loop controls, the thinking switch on by default, today's date, the variables llama-server passes, the generation
prompt, reasoning history and a template without a system role."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from localspec.engine.template import ChatTemplateError, render_chat, supports_system_role

TEMPLATES = Path(__file__).parent / "templates"
ASK = [{"role": "user", "content": "What is today?"}]
SCHEMA = {"type": "object", "properties": {"success": {"type": "boolean"}}, "required": ["success"]}
TOOL = {"type": "function", "function": {"name": "test", "description": "", "parameters": SCHEMA}}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.mark.parametrize("tools", [None, [], [TOOL]])
@pytest.mark.parametrize("name,thinking,end", [
    ("deepseek-r1-distill-qwen", None, "<think>\n"),  # llama-server's default (--reasoning auto): thinking on
    ("deepseek-r1-distill-qwen", False, "<think>\n</think>"),
    ("qwen3", None, "<|im_start|>assistant\n"),
    ("qwen3", False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("qwq", None, "<|im_start|>assistant\n<think>\n"),
    ("qwq", False, "<|im_start|>assistant\n<think>\n</think>"),
    ("command-r7b-tool-use", None, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),  # this one uses {% break %}
    ("command-r7b-tool-use", False, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"),
])
def test_thinking_is_on_unless_turned_off(name, thinking, end, tools):
    """llama.cpp's test_template.py::test_reasoning, the same templates and expected endings."""
    context = {} if thinking is None else {"enable_thinking": thinking}
    assert render_chat(template(name), ASK, bos="<s>", eos="</s>", tools=tools, **context).endswith(end)


@pytest.mark.parametrize("tools", [None, [TOOL]])
@pytest.mark.parametrize("name,fmt", [("llama-3.1", "%d %b %Y"), ("firefunction-v2", "%b %d %Y")])
def test_today_is_in_the_prompt(name, fmt, tools):
    """Llama 3.3 reads `date_string`, FireFunction v2 `datetime` and an undefined `functions` (added to a string:
    the empty string, as in llama.cpp)."""
    now = datetime(2031, 3, 9, 12, 0)
    prompt = render_chat(template(name), ASK, tools=tools, now=now)
    assert now.strftime(fmt) in prompt
    assert "26 Jul 2024" not in prompt


def test_strftime_now_and_loop_controls():
    tpl = ("{% for m in messages %}{% if m.role == 'stop' %}{% break %}{% endif %}"
           "{% if m.role == 'skip' %}{% continue %}{% endif %}{{ m.content }};{% endfor %}{{ strftime_now('%Y-%m') }}")
    msgs = [{"role": "user", "content": "a"}, {"role": "skip", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "stop", "content": "d"}, {"role": "user", "content": "e"}]
    assert render_chat(tpl, msgs, now=datetime(2030, 1, 2)) == "a;c;2030-01"


@pytest.mark.parametrize("add", [True, False])
def test_add_generation_prompt(add):
    """llama.cpp's test_add_generation_prompt: false leaves the variable undefined, so no assistant header."""
    prompt = render_chat(template("llama-3.1"), ASK, add_generation_prompt=add)
    assert ("<|start_header_id|>assistant<|end_header_id|>" in prompt) == add


def test_the_variables_llama_server_passes():
    tpl = ("{{ bos_token }}|{{ enable_thinking }}|{{ tools | tojson }}|{{ add_generation_prompt is defined }}|"
           "{{ date_string }}|{{ datetime }}|{{ custom }}")
    out = render_chat(tpl, ASK, bos="<s>", tools=[TOOL], add_generation_prompt=False, custom="x",
                      now=datetime(2031, 3, 9))
    assert out == f"<s>|True|{json.dumps([TOOL])}|False|09 Mar 2031|Mar 09 2031|x"
    assert render_chat("{{ tools is defined }}", ASK, tools=[]) == "False"  # no tools: not defined


def test_reasoning_history_is_rendered_where_the_template_reads_it():
    """Qwen 3's template shows the reasoning of the last answer after the last user query."""
    msgs = [{"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}]
    assert "<think>\nTwo and two make four.\n</think>" in render_chat(template("qwen3"), msgs,
                                                                     add_generation_prompt=False)


def test_a_template_without_a_system_role_gets_it_in_the_first_message():
    """Gemma 2's template raises on a system message; llama.cpp merges it into the next one."""
    tpl = template("gemma-2")
    assert not supports_system_role(tpl) and supports_system_role(template("qwen3"))
    prompt = render_chat(tpl, [{"role": "system", "content": "Be brief."}, *ASK], bos="<bos>")
    assert prompt == "<bos><start_of_turn>user\nBe brief.\nWhat is today?<end_of_turn>\n<start_of_turn>model\n"


def test_a_template_error_is_a_chat_template_error():
    with pytest.raises(ChatTemplateError, match="boom"):
        render_chat("{{ raise_exception('boom') }}", ASK)
    with pytest.raises(ChatTemplateError, match="unknown tag"):
        render_chat("{% nonsense %}", ASK)


def test_each_protocols_reasoning_history_reaches_the_template():
    """Anthropic's `thinking` blocks and Ollama's `thinking` become the message's `reasoning_content`."""
    from localspec.server.protocols.anthropic.convert import CountTokensRequest, openai_messages
    from localspec.server.request.chat_tools import ollama_messages

    thought = "Two and two make four."
    anthropic = openai_messages(CountTokensRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": thought, "signature": ""},
                                          {"type": "text", "text": "4"}]}]}))
    ollama = ollama_messages([{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4", "thinking": thought}])
    for msgs in (anthropic, ollama):
        assert msgs[-1]["reasoning_content"] == thought
        assert f"<think>\n{thought}\n</think>" in render_chat(template("qwen3"), msgs, add_generation_prompt=False)


def test_serve_reasoning_off_is_the_engines_default_and_a_request_wins():
    """`serve --reasoning off` (llama-server's option) sets the template's enable_thinking to false; a request's
    chat_template_kwargs (or Ollama's think) still decides for itself."""
    from fakes import FakeModel

    from localspec.engine.engine import Engine

    class Target(FakeModel):
        bos = eos = -1
        path = Path("fake.gguf")

        def metadata(self) -> dict[str, str]:
            return {}

    engine = Engine(Target(lambda c: 1), name="fake", chat_template=template("qwq"))
    assert engine.chat_prompt(ASK).endswith("<think>\n")
    engine.thinking = False
    assert engine.chat_prompt(ASK).endswith("<think>\n</think>")
    assert engine.chat_prompt(ASK, enable_thinking=True).endswith("<think>\n")
