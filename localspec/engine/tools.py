"""Tool calls: which format a model writes (from its chat template), the messages and tools as that template reads
them, and the model's answer read back as content plus calls, whole or streamed.

Formats, as llama-server detects them: `hermes` (Hermes 2/3, Qwen 2.5/3: `<tool_call>{json}</tool_call>`),
`llama3` (Llama 3.x: a JSON call, maybe after `<|python_tag|>`), `mistral` (`[TOOL_CALLS][...]`), `gemma`
(FunctionGemma: `<start_function_call>call:name{...}<end_function_call>`), and `generic` for a template with no
tool syntax: the tools go into a system message and the output is constrained to JSON (toolgrammar.py).
A request's ChatPlan (chatplan.py) calls `plan_tools` once and renders `tool_messages(...)` with
`template_context(...)`; servers constrain with `plan.grammar` and read the answer with `plan.parse` or
`plan.stream()`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from .toolgrammar import WRAPPED, allowed_tools, generic_instructions, tool_grammar
from .toolparse import PARSERS, Partial

FORMATS = ("hermes", "llama3", "mistral", "gemma", "generic")
CHOICES = ("auto", "none", "required")


def detect_tool_format(template: str | None) -> str:
    """The tool-call format a chat template writes; `generic` when it has no tool syntax."""
    t = template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<start_function_call>" in t or "<start_function_declaration>" in t:
        return "gemma"
    if "<|start_header_id|>" in t and ("ipython" in t or "<|python_tag|>" in t):
        return "llama3"
    return "generic"


def new_id(fmt: str) -> str:
    """A call id: Mistral's templates demand 9 letters and digits; others take OpenAI's `call_` ids."""
    abc = string.ascii_letters + string.digits
    if fmt == "mistral":
        return "".join(secrets.choice(abc) for _ in range(9))
    return "call_" + "".join(secrets.choice(abc) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`
    id: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed piece of a call, in OpenAI's shape: the first has the id and name, later ones argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def openai(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            d.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        else:
            d["function"] = {"arguments": self.arguments}
        return d


class ToolChoiceError(ValueError):
    """A tool_choice that names no offered tool, or is not one of auto / none / required / a function."""


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses tools: the format, the functions a call may name, the grammar (None: free output)."""

    fmt: str
    functions: list[dict]
    required: bool
    parallel: bool
    grammar: str | None

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        content, parts = PARSERS[self.fmt](text, True)
        calls = [ToolCall(p.name, p.args or "{}", new_id(self.fmt)) for p in parts if p.done and p.name]
        return content, calls if self.parallel else calls[:1]

    def stream(self) -> "ToolCallStream":
        return ToolCallStream(self.fmt, parallel=self.parallel)


def plan_tools(template: str | None, tools: list[dict] | None, choice: Any = "auto", *,
               parallel: bool = True) -> ToolPlan | None:
    """The plan for a request's tools; None when there are none or `tool_choice` is `none`."""
    choice = "auto" if choice is None else choice
    if isinstance(choice, str) and choice not in CHOICES:
        raise ToolChoiceError(f"tool_choice must be one of {', '.join(CHOICES)} or a function, got {choice!r}")
    if not tools or choice == "none":
        return None
    fns = allowed_tools(tools, choice)
    if not fns:
        raise ToolChoiceError(f"tool_choice names a function that is not in tools: {json.dumps(choice)}")
    required = choice != "auto"
    fmt = detect_tool_format(template)
    if required and fmt not in WRAPPED:
        fmt = "generic"  # only JSON-wrapping formats have a grammar of their own
    return ToolPlan(fmt, fns, required, parallel, tool_grammar(fmt, fns, required=required, parallel=parallel))


def template_context(plan: ToolPlan | None, tools: list[dict] | None) -> dict[str, Any]:
    """What the template gets besides the messages: `tools` for a native format (all of them, as OpenAI sends)."""
    if plan is None or plan.fmt == "generic":
        return {}
    return {"tools": [t if "function" in t else {"type": "function", "function": t} for t in tools or []]}


def tool_messages(messages: list[dict], plan: ToolPlan | None, template: str | None) -> list[dict]:
    """OpenAI messages as the template reads them: call arguments as objects, tool results with the tool's
    name; for the generic format calls and results as JSON text and the tools in the system message."""
    fmt = plan.fmt if plan else detect_tool_format(template)
    if fmt == "mistral":
        messages = [_mistral_ids(m) for m in messages]
    names = {c.get("id"): (c.get("function") or {}).get("name") for m in messages for c in m.get("tool_calls") or []}
    out = [_generic_message(m, names, plan is not None) if fmt == "generic" else _native_message(m, names)
           for m in messages]
    if fmt == "generic":
        out = _join_results(messages, out)
    if plan is not None and plan.fmt == "generic":
        text = generic_instructions(plan.functions, required=plan.required, parallel=plan.parallel)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates demand it (9 letters and digits, else they raise): kept when it is one,
    else a digest of it, so a call and its result still carry the same id."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _mistral_ids(m: dict) -> dict:
    if m.get("tool_calls"):
        m = {**m, "tool_calls": [{**c, "id": mistral_id(str(c.get("id") or ""))} for c in m["tool_calls"]]}
    if m.get("role") == "tool" and m.get("tool_call_id") is not None:
        m = {**m, "tool_call_id": mistral_id(str(m["tool_call_id"]))}
    return m


def _native_message(m: dict, names: dict) -> dict:
    m = dict(m)
    if m.get("tool_calls"):
        m["tool_calls"] = [{**c, "function": {**c.get("function", {}),
                                              "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                           for c in m["tool_calls"]]
        m["content"] = m.get("content") or ""
    if m.get("role") == "tool" and not m.get("name"):
        m["name"] = names.get(m.get("tool_call_id")) or ""
    return m


def _generic_message(m: dict, names: dict, answers: bool) -> dict:
    """One message in the generic format; `answers`: earlier plain answers as `{"response": ...}` too (the shape
    the grammar holds this answer to), only while tools are offered."""
    if m.get("tool_calls"):
        calls = [{"name": c.get("function", {}).get("name"),
                  "arguments": _arguments(c.get("function", {}).get("arguments"))} for c in m["tool_calls"]]
        return {"role": "assistant", "content": json.dumps({"tool_calls": calls})}
    if m.get("role") == "tool":
        result = {"tool": m.get("name") or names.get(m.get("tool_call_id")) or "", "content": m.get("content", "")}
        return {"role": "user", "content": json.dumps({"tool_response": result})}
    text = m.get("content") or ""
    if answers and m.get("role") == "assistant" and text and not text.lstrip().startswith("{"):
        return {"role": "assistant", "content": json.dumps({"response": text})}
    return {**m, "content": text}


def _join_results(messages: list[dict], out: list[dict]) -> list[dict]:
    """The results of parallel calls, and a user message right after them, as one user turn, a JSON line each:
    templates that want user and assistant turns in turn (Gemma's) refuse two user turns in a row, and Codex runs
    several calls at once."""
    joined: list[dict] = []
    for i, m in enumerate(out):
        if i and messages[i - 1].get("role") == "tool" and m["role"] == "user":
            joined[-1] = {**joined[-1], "content": f"{joined[-1]['content']}\n{m['content']}"}
        else:
            joined.append(m)
    return joined


@dataclass
class ToolCallStream:
    """Text deltas in, (content delta, call deltas) out; `calls` once `finish()` has run."""

    fmt: str
    parallel: bool = True
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    _content: int = 0  # content characters sent
    _ids: list[str] = field(default_factory=list)  # announced calls' ids
    _args: list[int] = field(default_factory=list)  # argument characters sent per call

    def push(self, delta: str) -> tuple[str, list[ToolCallDelta]]:
        self.text += delta
        return self._diff(*PARSERS[self.fmt](self.text, False))

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content, parts = PARSERS[self.fmt](self.text, True)
        parts = [p for p in parts if p.done and p.name][: None if self.parallel else 1]
        out = self._diff(content, parts, final=True)  # a call announced but never completed is dropped
        self.calls = [ToolCall(p.name or "", p.args or "{}", i) for p, i in zip(parts, self._ids)]
        return out

    def _diff(self, content: str, parts: list[Partial], final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        text = content[self._content:] if len(content) > self._content else ""
        self._content = max(self._content, len(content))
        deltas: list[ToolCallDelta] = []
        for i, p in enumerate(parts[: None if self.parallel else 1]):
            if p.name is None:
                break
            args = p.args or ("{}" if final and p.done else "")
            if i >= len(self._ids):
                self._ids.append(new_id(self.fmt))
                self._args.append(len(args))
                deltas.append(ToolCallDelta(i, args, id=self._ids[i], name=p.name))
            elif len(args) > self._args[i]:
                deltas.append(ToolCallDelta(i, args[self._args[i]:]))
                self._args[i] = len(args)
        return text, deltas
