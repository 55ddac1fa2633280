"""One chat turn: the user's prompt, or the assistant's answer with its stats line.

The answer has two faces: streaming Markdown, and a token view where text that came from accepted drafts is
coloured (so a person sees where the drafter was right). The app toggles between them; both are built from
the same `Segment`s, so switching mid-answer loses nothing.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from ..stream import Segment

ACCEPTED_STYLE = "bold green"


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { margin: 1 0 0 0; padding: 0 1; border-left: thick $accent; background: $boost; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Text(text))
        self.text = text


class AssistantMessage(Vertical):
    DEFAULT_CSS = """
    AssistantMessage { height: auto; margin: 1 0 0 0; padding: 0 1; border-left: thick $success 50%; }
    AssistantMessage > Markdown { margin: 0; padding: 0; }
    AssistantMessage > Markdown > * { margin-bottom: 0; }
    AssistantMessage > #tokens { display: none; }
    AssistantMessage.-coloured > #tokens { display: block; }
    AssistantMessage.-coloured > Markdown { display: none; }
    AssistantMessage > #meta { width: 100%; color: $text-muted; text-style: italic; }
    AssistantMessage.-error > #meta { color: $error; text-style: bold; }
    """

    def __init__(self, text: str = "", *, meta: str = "", coloured: bool = False,
                 segments: tuple[Segment, ...] | None = None) -> None:
        super().__init__()
        self.segments: list[Segment] = list(segments) if segments is not None else (
            [Segment(text, False)] if text else [])
        self.coloured = coloured
        self._meta = meta
        self._stream: MarkdownStream | None = None  # streams into the Markdown face; coalesces when behind
        self.set_class(coloured, "-coloured")

    def compose(self) -> ComposeResult:
        yield Static(self.rich_text(), id="tokens")
        yield Markdown(self.text)
        yield Label(self._meta, id="meta", markup=False)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    @property
    def accepted_text(self) -> str:
        return "".join(s.text for s in self.segments if s.accepted)

    def rich_text(self) -> Text:
        t = Text()
        for s in self.segments:
            t.append(s.text, style=ACCEPTED_STYLE if s.accepted else "")
        return t

    async def add(self, segments: tuple[Segment, ...]) -> None:
        """Append streamed text; only the visible face is updated (the other catches up on toggle)."""
        if not segments:
            return
        self.segments.extend(segments)
        if self.coloured:
            self.query_one("#tokens", Static).update(self.rich_text())
        else:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(Markdown))
            await self._stream.write("".join(s.text for s in segments))

    async def set_coloured(self, on: bool) -> None:
        self.coloured = on
        await self.end_stream()
        if on:
            self.query_one("#tokens", Static).update(self.rich_text())
        else:
            await self.query_one(Markdown).update(self.text)
        self.set_class(on, "-coloured")

    async def end_stream(self) -> None:
        """Flush the Markdown stream (at the end of an answer, or before the whole text is re-rendered)."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.stop()

    def set_meta(self, text: str, *, error: bool = False) -> None:
        self._meta = text
        self.query_one("#meta", Label).update(text)
        self.set_class(error, "-error")

    @property
    def meta(self) -> str:
        return self._meta
