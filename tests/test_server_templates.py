"""The chat template through a real `localspec serve --chat-template-file` (embedded SmolLM2): `/apply-template`,
the input-token count and `/v1/chat/completions` render the variables llama-server passes (tools, thinking on,
today's date, reasoning history), honour `add_generation_prompt: false`, and answer 400 where llama-server does."""

from __future__ import annotations

from datetime import date
from typing import Any, Iterator

import httpx
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

PROBE = ("{% for m in messages %}{% if m.content == 'STOP' %}{% break %}{% endif %}"
         "<{{ m.role }}>{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}{{ m.content }}"
         "{% endfor %}|thinking={{ enable_thinking }}|tools={{ tools | map(attribute='function.name') | join(',') "
         "if tools is defined else '-' }}|{{ date_string }}{% if add_generation_prompt %}<assistant>{% endif %}")
HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def http(smollm2_path, tmp_path_factory) -> Iterator[httpx.Client]:
    tpl = tmp_path_factory.mktemp("tpl") / "probe.jinja"
    tpl.write_text(PROBE)
    with ServerProcess(["--ctx", "1024", "--threads", "2", "--chat-template-file", str(tpl)]) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            yield c


def prompt(http: httpx.Client, **body: Any) -> str:
    r = http.post("/apply-template", json={"messages": HI, **body})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_apply_template_passes_what_llama_server_passes(http):
    today = date.today().strftime("%d %b %Y")
    assert prompt(http) == f"<user>hi|thinking=True|tools=-|{today}<assistant>"
    assert "get_weather" in prompt(http, tools=[TOOL])  # this template has no tool syntax: the generic system text
    assert "|thinking=False|" in prompt(http, chat_template_kwargs={"enable_thinking": False})
    assert prompt(http, add_generation_prompt=False).endswith(today)
    msgs = [*HI, {"role": "assistant", "content": "4", "reasoning_content": "2+2"}, *HI,
            {"role": "user", "content": "STOP"}, *HI]
    assert prompt(http, messages=msgs).startswith("<user>hi<assistant>[2+2]4<user>hi|")  # stopped at the break


def test_input_tokens_count_the_tools(http):
    def count(**body: Any) -> int:
        return http.post("/v1/chat/completions/input_tokens", json={"messages": HI, **body}).json()["input_tokens"]
    assert count(tools=[TOOL]) > count()


def test_what_llama_server_refuses_is_a_400(http):
    prefill = [*HI, {"role": "assistant", "content": "Hel"}]
    both = http.post("/apply-template", json={"messages": prefill, "continue_final_message": True,
                                              "add_generation_prompt": True})
    assert both.status_code == 400 and "add_generation_prompt" in both.text
    assert prompt(http, messages=prefill, continue_final_message=True, add_generation_prompt=False).endswith("Hel")
    calls = [*HI, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}]
    assert http.post("/apply-template", json={"messages": calls}).status_code == 400
    bad = http.post("/v1/chat/completions", json={"messages": HI, "chat_template_kwargs": {"enable_thinking": "yes"}})
    assert bad.status_code == 400 and "enable_thinking" in bad.text


def test_chat_completions_renders_the_same_prompt(http):
    r = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1, "temperature": 0,
                                                "add_generation_prompt": False}).json()
    n = http.post("/v1/chat/completions/input_tokens", json={"messages": HI, "add_generation_prompt": False})
    assert r["usage"]["prompt_tokens"] == n.json()["input_tokens"]
