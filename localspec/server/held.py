"""The next request on a connection a runner holds (server/handoff.py): read as uvicorn reads one (httptools),
and the runner's to answer only if the router would send it to this runner (channel.matches).

Why: on a keep-alive connection an editor sends request after request for the same model. Held by the runner
between them, such a request goes from the caller to the model's process directly, with no hop through the
router (docs/bench/router.md#held); anything else goes back to the router as the bytes the caller sent.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import httptools

from .channel import Hold, matches, request_scope

MORE = "more"  # parse: the request is not complete yet


class _Message:
    """httptools' callbacks for one request."""

    def __init__(self) -> None:
        self.url, self.body = b"", bytearray()
        self.headers: list[tuple[bytes, bytes]] = []
        self.begun, self.complete = 0, False

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def parse(data: bytes, hold: Hold, like: dict[str, Any]) -> tuple[dict[str, Any], bytes] | str | None:
    """The request in `data` as (scope, body) when it is one whole request for this runner; MORE when it is not
    complete yet; None when it is not the runner's (another path or model, a router route, more than one request,
    anything httptools refuses): the router reads it instead. `like`: the scope of the request before it."""
    message = _Message()
    parser = httptools.HttpRequestParser(message)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError:  # an upgrade too
        return None
    if message.begun > 1:
        return None
    if not message.complete:
        return MORE
    url = httptools.parse_url(message.url)
    raw_path = url.path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    method, body = parser.get_method().decode("ascii"), bytes(message.body)
    if not matches(hold, method, path, message.headers, body):
        return None
    scope = request_scope(method, path, raw_path, url.query or b"", message.headers, like.get("client"),
                          like.get("server"), parser.get_http_version())
    return scope, body
