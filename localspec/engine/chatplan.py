"""A chat request's plan: everything the chat template needs to render its prompt, decided once.

A server route translates its protocol's request into one `ChatPlan` (`plan_chat` does the tool part); the engine
renders the plan once (`Engine.render`) and tokenizes it once, and the same plan says how to read the answer
(`reading`). So the prompt on `/apply-template`, the token count routes and the generation routes is one text.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from .answer import Reading
from .reasoning import opens_thinking
from .tools import ToolPlan, plan_tools, template_context, tool_messages


@dataclass(frozen=True)
class ChatPlan:
    """One chat request as the template reads it.

    `messages` are in the template's terms (calls and results in the model's tool format); `context` holds the
    other template variables (`tools`, `enable_thinking`, the request's `chat_template_kwargs`). `prefill` is an
    assistant's text the answer continues: it follows the rendered messages. `tools` is the tool plan (None: no
    tools), and `reasoning` the `--reasoning-format` the answer is read with.
    """

    messages: tuple[dict[str, Any], ...]
    context: Mapping[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    prefill: str = ""
    tools: ToolPlan | None = None
    reasoning: str = "none"

    @property
    def grammar(self) -> str | None:
        """The tool grammar the answer is held to from its first token (None: free output)."""
        return self.tools.grammar if self.tools else None

    def reading(self, prompt: str) -> Reading:
        """How to read the answer to `prompt`, this plan's rendered text. A template that opened a think block
        starts the answer as reasoning, unless a grammar holds the answer to its own shape."""
        started = self.reasoning != "none" and self.grammar is None and opens_thinking(prompt)
        return Reading(self.tools, self.reasoning, started)

    def continuing(self) -> ChatPlan:
        """The plan whose answer continues its last message (an assistant prefill): that message's text follows
        the prompt for the messages before it, which ends with the assistant's turn opening."""
        last = self.messages[-1]
        return replace(self, messages=self.messages[:-1], prefill=str(last.get("content") or ""),
                       add_generation_prompt=True)

    def system_head(self) -> ChatPlan | None:
        """The plan of the leading system messages alone (what a context shift keeps); None without one."""
        n = next((i for i, m in enumerate(self.messages) if m.get("role") != "system"), len(self.messages))
        if n == 0:
            return None
        return replace(self, messages=self.messages[:n], add_generation_prompt=False, prefill="")


def plan_chat(template: str | None, messages: Sequence[Mapping[str, Any]], *, tools: list[dict] | None = None,
              choice: Any = "auto", parallel: bool = True, reasoning: str = "none",
              context: Mapping[str, Any] | None = None) -> ChatPlan:
    """The plan for OpenAI-style `messages` and `tools` under `template`: the tool plan, the messages and tools
    in the template's terms, and `context` (the request's template variables). A bad `choice` raises
    ToolChoiceError."""
    plan = plan_tools(template, tools, choice, parallel=parallel)
    msgs = tool_messages([dict(m) for m in messages], plan, template)
    return ChatPlan(tuple(msgs), {**(context or {}), **template_context(plan, tools)}, tools=plan,
                    reasoning=reasoning)
