"""`<think>` blocks split from the answer: OpenAI-style `reasoning_content`, Ollama's `thinking`.

`--reasoning-format` as llama-server has it: `none` leaves the thinking in the content; `deepseek` moves it to
the reasoning field; `auto` (the default) does the same. A template that opens the block itself (its generation
prompt ends with `<think>`) starts the answer inside it: `started=True`, and the text up to `</think>` is the
reasoning. Streaming holds back a tail that may still become a tag, so each field only grows.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONING_FORMATS = ("none", "deepseek", "auto")
OPEN, CLOSE = "<think>", "</think>"


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a think block (the template opened it)."""
    return prompt.rstrip().endswith(OPEN)


def _hold(text: str, tag: str) -> int:
    """Length of text's tail that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_reasoning(text: str, fmt: str = "auto", *, started: bool = False,
                    final: bool = True) -> tuple[str, str]:
    """text -> (reasoning, content). On a prefix (`final=False`) a possible tag at the end is in neither."""
    if fmt == "none":
        return "", text
    body = text
    if not started:
        lead = len(body) - len(body.lstrip())
        if body.startswith(OPEN, lead):
            body = body[lead + len(OPEN):]
        elif not final and OPEN.startswith(body.lstrip()):
            return "", ""  # may still become the opening tag
        else:
            return "", text
    i = body.find(CLOSE)
    if i < 0:
        if final:
            return body.lstrip("\n"), ""
        # held back: a tail that may become `</think>`, and the newlines before it (the split strips them)
        return body[:len(body) - _hold(body, CLOSE)].strip("\n"), ""
    return body[:i].strip("\n"), body[i + len(CLOSE):].lstrip("\n")


@dataclass
class ReasoningStream:
    """Text deltas in, (reasoning delta, content delta) out."""

    fmt: str = "auto"
    started: bool = False
    text: str = ""
    _sent: tuple[int, int] = (0, 0)

    def push(self, delta: str) -> tuple[str, str]:
        self.text += delta
        return self._diff(*split_reasoning(self.text, self.fmt, started=self.started, final=False))

    def finish(self) -> tuple[str, str]:
        return self._diff(*split_reasoning(self.text, self.fmt, started=self.started, final=True))

    def _diff(self, reasoning: str, content: str) -> tuple[str, str]:
        r, c = self._sent
        self._sent = (max(r, len(reasoning)), max(c, len(content)))
        return reasoning[r:], content[c:]
