"""Chat templates: a GGUF's `tokenizer.chat_template` (Jinja) rendered as llama.cpp's renderer renders it.

llama-server passes a template more than the messages: `bos_token`, `eos_token`, `enable_thinking` (always
defined), `tools` when the request has any, `add_generation_prompt` only when it is true, `date_string`
("26 Jul 2024") and `datetime` ("Jul 26 2024") for today, then the request's `chat_template_kwargs`; the
globals `raise_exception` and `strftime_now` (local time). Its renderer supports `{% break %}` and
`{% continue %}` (jinja2's loopcontrols extension here) and treats an undefined value or null joined to a string
with `+` as the empty string (FireFunction v2 adds an undefined `functions`).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Sequence

from ..errors import LocalspecError


class ChatTemplateError(LocalspecError):
    exit_code = 2


def render_chat(template: str, messages: Sequence[dict], *, bos: str = "", eos: str = "",
                add_generation_prompt: bool = True, enable_thinking: bool = True, tools: list[dict] | None = None,
                now: datetime | None = None, **context: Any) -> str:
    """Render `template` over `messages` in a sandbox, with the variables llama-server passes (see above);
    `context` is what else the template reads (`chat_template_kwargs`), and wins over the rest."""
    messages = list(messages)
    if messages and messages[0].get("role") == "system" and not supports_system_role(template):
        messages = _merge_system(messages)
    if _has_late_system(messages) and not supports_late_system(template):
        messages = fold_late_system(messages)
    return _render(template, messages, bos=bos, eos=eos, add_generation_prompt=add_generation_prompt,
                   enable_thinking=enable_thinking, tools=tools, now=now, **context)


def _render(template: str, messages: list[dict], *, bos: str, eos: str, add_generation_prompt: bool,
            enable_thinking: bool, tools: list[dict] | None, now: datetime | None, **context: Any) -> str:
    from jinja2 import TemplateError

    now = now or datetime.now()
    env = _environment(now)
    variables: dict[str, Any] = {"messages": messages, "bos_token": bos, "eos_token": eos,
                                 "enable_thinking": enable_thinking, "date_string": now.strftime("%d %b %Y"),
                                 "datetime": now.strftime("%b %d %Y")}
    if tools:
        variables["tools"] = tools
    if add_generation_prompt:
        variables["add_generation_prompt"] = True
    try:
        return env.from_string(template).render({**variables, **context})
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None


@functools.lru_cache(maxsize=16)
def supports_system_role(template: str) -> bool:
    """Whether the template renders a system message (Gemma 2's raises instead), as llama.cpp probes it."""
    needle = "<localspec system needle>"
    try:
        probe = functools.partial(_render, template, bos="", eos="", add_generation_prompt=False,
                                  enable_thinking=True, tools=None, now=None)
        text = probe([{"role": "user", "content": "x"}])
        with_system = probe([{"role": "system", "content": needle}, {"role": "user", "content": "x"}])
    except Exception:
        return False
    return needle in with_system and needle not in text


@functools.lru_cache(maxsize=16)
def supports_late_system(template: str) -> bool:
    """Whether the template renders a system message after the conversation began, in its own form, and leaves
    the text before it as it was (ChatML and Llama 3 do; Gemma's wants user and model turns in turn)."""
    needle, answer = "<localspec system needle>", "<localspec answer>"
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": answer}]
    try:
        probe = functools.partial(_render, template, bos="", eos="", add_generation_prompt=True,
                                  enable_thinking=True, tools=None, now=None)
        without = probe([*head, {"role": "user", "content": "z"}])
        text = probe([*head, {"role": "system", "content": needle}, {"role": "user", "content": "z"}])
    except Exception:
        return False
    if answer not in without or needle not in text:
        return False
    end = without.index(answer) + len(answer)
    return text[:end] == without[:end] and needle in text[end:]


def _has_late_system(messages: Sequence[dict]) -> bool:
    seen = False
    for m in messages:
        if m.get("role") != "system":
            seen = True
        elif seen:
            return True
    return False


def fold_late_system(messages: Sequence[dict]) -> list[dict]:
    """A system message sent mid-conversation (Claude Code's task notifications), for a template that takes
    none there, as user text where it was sent: joined to the user message before it, else opening the next
    user message (a user message of its own when none follows). Everything before it renders as it did on the
    turn before, so the prompt cache still holds that turn's prompt; moved to the front, it would change the
    prompt's first tokens on every turn."""
    out: list[dict] = []
    pending: list[str] = []
    joined = False  # the last message in `out` is a user message a system text was joined to
    for m in messages:
        late = m.get("role") == "system" and any(x.get("role") != "system" for x in out)
        text = m.get("content")
        user = m.get("role") == "user" and isinstance(text, str)
        if late and isinstance(text, str):
            if not pending and out[-1].get("role") == "user" and isinstance(out[-1].get("content"), str):
                out[-1], joined = {**out[-1], "content": _join(out[-1]["content"], text)}, True
            else:
                pending.append(text)
            continue
        if joined and user:  # a user message after the one a system text joined: one turn, as it was sent
            out[-1] = {**out[-1], "content": _join(out[-1]["content"], str(text))}
            continue
        if pending and user:
            m = {**m, "content": _join(*pending, str(text))}
        elif pending:
            out.append({"role": "user", "content": _join(*pending)})
        pending, joined = [], False
        out.append(m)
    if pending:
        out.append({"role": "user", "content": _join(*pending)})
    return out


def _join(*texts: str) -> str:
    return "\n\n".join(t for t in texts if t)


def _merge_system(messages: list[dict]) -> list[dict]:
    """llama.cpp's workaround for a template without a system role: the system text opens the next message."""
    system, rest = messages[0], messages[1:]
    if not rest:
        return rest
    return [{**rest[0], "content": f"{system.get('content') or ''}\n{rest[0].get('content') or ''}"}, *rest[1:]]


def _environment(now: datetime) -> Any:
    from jinja2 import Undefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Environment(ImmutableSandboxedEnvironment):
        """llama.cpp's `+`: an undefined value or null next to a string is the empty string."""

        intercepted_binops = frozenset(["+"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if isinstance(left, str) and (right is None or isinstance(right, Undefined)):
                return left
            if isinstance(right, str) and (left is None or isinstance(left, Undefined)):
                return right
            return super().call_binop(context, operator, left, right)

    def raise_exception(msg: str) -> None:
        raise ChatTemplateError(msg)

    env = Environment(trim_blocks=True, lstrip_blocks=True,
                      extensions=["jinja2.ext.loopcontrols", _generation_extension()])
    env.globals.update(raise_exception=raise_exception, strftime_now=now.strftime)
    env.filters["tojson"] = _tojson
    return env


def _tojson(x: Any, indent: int | None = None, separators: Sequence[str] | None = None, sort_keys: bool = False,
            ensure_ascii: bool = False) -> str:
    """HF's tojson: plain JSON (Jinja's own escapes <, > and & for HTML), keyword arguments allowed."""
    return json.dumps(x, indent=indent, separators=tuple(separators) if separators else None,  # type: ignore[arg-type]
                      sort_keys=sort_keys, ensure_ascii=ensure_ascii, default=_json_value)


def _json_value(x: Any) -> Any:
    """What Jinja's filters hand over lazily (`map`, `select`) as the list it stands for."""
    if hasattr(x, "__iter__"):
        return list(x)
    raise TypeError(f"{type(x).__name__} is not JSON")


def _generation_extension() -> type:
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """HF's `{% generation %}...{% endgeneration %}` (it marks the assistant's text for training): its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    return Generation
