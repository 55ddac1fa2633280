"""Generated text -> (content, tool calls), for each tool-call format, on a whole answer or on the part generated
so far (streaming).

Every parser reads the text from the start each time it is called: answers are short and one parser then
serves both the whole answer and each streamed prefix. On a prefix (`final=False`) the content stops before
anything that may still become a tool-call marker, and a call's `args` is the JSON text of its arguments read
so far, so what is streamed is always a prefix of the final answer. A call that does not parse in the finished
text stays content, as llama-server leaves it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

NAME_KEYS = ("name",)
ARG_KEYS = ("arguments", "parameters")
_WS = re.compile(r"\s*")


@dataclass
class Partial:
    """One call as read so far: name None until its text is complete, args the raw JSON text read so far."""

    name: str | None = None
    args: str = ""
    done: bool = False


class BadCall(ValueError):
    """The text at a call's place is not a call."""


Parsed = tuple[str, list[Partial]]


def _ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _hold(text: str, markers: tuple[str, ...]) -> str:
    """text without a tail that is the start of a marker (it may still become one)."""
    for n in range(min(len(text), max(len(m) for m in markers)), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return text[:-n]
    return text


def _until(text: str, pos: int, marker: str, final: bool) -> tuple[str, int]:
    """The content from pos up to the next marker, and the marker's place (-1: none yet). On a prefix a tail that
    may still become the marker is held back."""
    i = text.find(marker, pos)
    if i >= 0:
        return text[pos:i], i
    tail = text[pos:]
    return (tail if final else _hold(tail, (marker,))), -1


def json_extent(text: str, pos: int) -> int | None:
    """End of the JSON value starting at pos, or None when the text ends inside it."""
    depth, in_str, esc = 0, False, False
    for i in range(pos, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and c in ",}] \n\t":
            return i
    return None


def _value(text: str, pos: int) -> tuple[object, int] | None:
    """A complete JSON value at pos and its end; None when the text ends inside it."""
    end = json_extent(text, pos)
    if end is None:
        return None
    try:
        return json.loads(text[pos:end]), end
    except ValueError:
        raise BadCall(text[pos:end]) from None


def scan_call(text: str, pos: int, *, name_keys: tuple[str, ...] = NAME_KEYS,
              arg_keys: tuple[str, ...] = ARG_KEYS) -> tuple[Partial, int]:
    """A call object `{"name": ..., "arguments": {...}}` at pos -> (the call so far, where it ended)."""
    call = Partial()
    pos = _ws(text, pos)
    if pos >= len(text):
        return call, pos
    if text[pos] != "{":
        raise BadCall(text[pos:pos + 20])
    pos += 1
    while True:
        pos = _ws(text, pos)
        if pos >= len(text):
            return call, pos
        if text[pos] == "}":
            if call.name is None:
                raise BadCall("a call without a name")
            call.done, call.args = True, call.args or "{}"
            return call, pos + 1
        if text[pos] == ",":
            pos = _ws(text, pos + 1)
        key = _value(text, pos)
        if key is None:
            return call, len(text)
        k, pos = key
        pos = _ws(text, pos)
        if pos >= len(text):
            return call, pos
        if text[pos] != ":":
            raise BadCall("a key without a value")
        pos = _ws(text, pos + 1)
        if k in arg_keys:
            end = json_extent(text, pos)
            call.args = text[pos:end if end is not None else len(text)]
            if end is None:
                return call, len(text)
            _value(text, pos)  # complete: it must parse (a call whose arguments do not stays content)
            pos = end
            continue
        v = _value(text, pos)
        if v is None:
            return call, len(text)
        if k in name_keys and isinstance(v[0], str):
            call.name = v[0]
        pos = v[1]


def _tagged(text: str, final: bool, open_: str, close: str) -> Parsed:
    """Content with calls as `open_ {json} close` anywhere after it (Hermes / Qwen)."""
    content, pos = "", 0
    calls: list[Partial] = []
    while True:
        piece, i = _until(text, pos, open_, final)
        content += piece
        if i < 0:
            return content, calls
        try:
            call, end = scan_call(text, i + len(open_))
        except BadCall:
            return (content + text[i:], calls) if final else (content, calls)
        calls.append(call)
        if not call.done:
            return content, calls
        end = _ws(text, end)
        if not final and close.startswith(text[end:]):
            return content, calls  # the closing tag is still coming
        if text.startswith(close, end):
            end = _ws(text, end + len(close))
        pos = end


def hermes(text: str, final: bool) -> Parsed:
    return _tagged(text, final, "<tool_call>", "</tool_call>")


def llama3(text: str, final: bool) -> Parsed:
    """Llama 3.x: the whole answer is one JSON call, `{"name": ..., "parameters": {...}}`, maybe after
    `<|python_tag|>`; several are separated by `;`."""
    start = _ws(text, 0)
    body = text[start:]
    tag = "<|python_tag|>"
    if not final and tag.startswith(body):
        return "", []
    pos = start + len(tag) if body.startswith(tag) else start
    if not text[pos:].lstrip().startswith("{"):
        return text, []
    calls: list[Partial] = []
    try:
        while True:
            call, pos = scan_call(text, pos)
            calls.append(call)
            pos = _ws(text, pos)
            if not call.done or not text.startswith(";", pos):
                break
            pos += 1
    except BadCall:
        return (text, []) if final else ("", calls)
    if final and (not calls or not calls[-1].done or text[pos:].strip()):
        return text, []
    return "", calls


def mistral(text: str, final: bool) -> Parsed:
    """Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]`, or the later
    `[TOOL_CALLS]name[ARGS]{...}` (one marker per call)."""
    tag = "[TOOL_CALLS]"
    content, i = _until(text, 0, tag, final)
    if i < 0:
        return content, []
    pos = i + len(tag)
    calls: list[Partial] = []
    try:
        pos = _ws(text, pos)
        if text.startswith("[", pos):
            pos += 1
            while True:
                call, pos = scan_call(text, pos)
                calls.append(call)
                pos = _ws(text, pos)
                if not call.done or not text.startswith(",", pos):
                    break
                pos += 1
            return content, calls
        while pos < len(text):
            a = text.find("[ARGS]", pos)
            if a < 0:
                return content, calls
            call = Partial(name=text[pos:a].strip())
            end = json_extent(text, _ws(text, a + 6))
            call.args = text[_ws(text, a + 6):end or len(text)]
            call.done = end is not None
            calls.append(call)
            if end is None:
                break
            pos = _ws(text, end)
            if text.startswith(tag, pos):
                pos += len(tag)
    except BadCall:
        return (text, []) if final else (content, calls)
    return content, calls


_GEMMA_OPEN, _GEMMA_CLOSE, _ESC = "<start_function_call>", "<end_function_call>", "<escape>"


def gemma(text: str, final: bool) -> Parsed:
    """FunctionGemma: `<start_function_call>call:NAME{key:value,...}<end_function_call>`, strings between
    `<escape>` marks. The arguments are JSON once the call is complete."""
    content, pos = "", 0
    calls: list[Partial] = []
    while True:
        piece, i = _until(text, pos, _GEMMA_OPEN, final)
        content += piece
        if i < 0:
            return content, calls
        j = text.find(_GEMMA_CLOSE, i)
        body = text[i + len(_GEMMA_OPEN):j if j >= 0 else len(text)]
        m = re.match(r"\s*call:([\w.\-]+)\{", body)
        if j < 0:
            if m:
                calls.append(Partial(name=m.group(1)))
            return content, calls
        try:
            if not m:
                raise BadCall(body)
            args, end = _gemma_value(body, m.end() - 1)
            calls.append(Partial(name=m.group(1), args=json.dumps(args), done=True))
        except (BadCall, IndexError):
            return content + text[i:], calls
        pos = j + len(_GEMMA_CLOSE)


def _gemma_value(s: str, pos: int) -> tuple[object, int]:
    pos = _ws(s, pos)
    if s.startswith(_ESC, pos):
        end = s.index(_ESC, pos + len(_ESC))
        return s[pos + len(_ESC):end], end + len(_ESC)
    if s[pos] in "{[":
        close, out_d, out_l = "}" if s[pos] == "{" else "]", {}, []
        pos = _ws(s, pos + 1)
        while s[pos] != close:
            if close == "}":
                colon = s.index(":", pos)
                key = s[pos:colon].strip()
                out_d[key], pos = _gemma_value(s, colon + 1)
            else:
                v, pos = _gemma_value(s, pos)
                out_l.append(v)
            pos = _ws(s, pos)
            if s[pos] == ",":
                pos = _ws(s, pos + 1)
        return (out_d if close == "}" else out_l), pos + 1
    m = re.match(r"[^,}\]]+", s[pos:])
    if not m:
        raise BadCall(s[pos:])
    word = m.group(0).strip()
    try:
        return json.loads(word), pos + m.end()
    except ValueError:
        return word, pos + m.end()


def generic(text: str, final: bool) -> Parsed:
    """The constrained format: `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}`."""
    start = _ws(text, 0)
    if start >= len(text):
        return "", []
    if text[start] != "{":
        return text, []
    pos, content = start + 1, ""
    calls: list[Partial] = []
    try:
        while True:
            pos = _ws(text, pos)
            if pos >= len(text) or text[pos] == "}":
                return content, calls
            if text[pos] == ",":
                pos = _ws(text, pos + 1)
            key = _value(text, pos)
            if key is None:
                return content, calls
            pos = _ws(text, key[1])
            if not text.startswith(":", pos):
                return content, calls
            pos = _ws(text, pos + 1)
            if key[0] == "response":
                end = json_extent(text, pos)
                content = _partial_string(text[pos:end or len(text)])
                if end is None:
                    return content, calls
                pos = end
            elif key[0] == "tool_calls":
                pos = _calls_array(text, pos, calls)
                if pos < 0:
                    return content, calls
            else:
                v = _value(text, pos)
                if v is None:
                    return content, calls
                pos = v[1]
    except BadCall:
        return (text, []) if final else (content, calls)


def _calls_array(text: str, pos: int, calls: list[Partial]) -> int:
    """Append the calls of a JSON array at pos; the position after it, or -1 when the text ends inside."""
    if not text.startswith("[", pos):
        raise BadCall(text[pos:pos + 20])
    pos += 1
    while True:
        pos = _ws(text, pos)
        if pos >= len(text):
            return -1
        if text[pos] == "]":
            return pos + 1
        if text[pos] == ",":
            pos += 1
            continue
        call, pos = scan_call(text, pos)
        calls.append(call)
        if not call.done:
            return -1


def _partial_string(raw: str) -> str:
    """The text of a JSON string read so far (an escape cut in the middle is left for later)."""
    if not raw.startswith('"'):
        return ""
    body = raw[1:-1] if len(raw) > 1 and raw.endswith('"') and json_extent(raw, 0) else raw[1:]
    for cut in range(0, 7):
        try:
            return json.loads('"' + body[:len(body) - cut] + '"')
        except ValueError:
            continue
    return ""


PARSERS: dict[str, Callable[[str, bool], Parsed]] = {
    "hermes": hermes, "llama3": llama3, "mistral": mistral, "gemma": gemma, "generic": generic}
