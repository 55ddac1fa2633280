"""A Hugging Face hub served in this process, for the tests of `localspec models pull` and of drafters found in
the hub cache: the routes the real huggingface-hub client uses (tree listing, HEAD and ranged GET on /resolve/)
with the headers it reads (X-Repo-Commit, ETag, X-Linked-Etag = sha256, X-Linked-Size, Content-Range). It can cut
a download mid-file (close the connection), fail afterwards (a dead network), or lie about a checksum.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import numpy as np

COMMIT = "c0ffee" + "0" * 34
CHUNK = 4096


def write_gguf(path: Path, n: int = 50_000, name: str = "tiny") -> bytes:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(256)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(64)])
    w.add_tensor("blk.0.weight", np.arange(n, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


class FakeHub:
    """repo -> {filename: bytes}; `cut` = {filename: n}: the next GET of that file stops after n bytes."""

    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.cut: dict[str, int] = {}
        self.dead_after_cut = False
        self.bad_sha: set[str] = set()
        self.log: list[tuple[str, str, str | None]] = []
        hubself = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hubself.handle(self, head=True)

            def do_GET(self):
                hubself.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ranges(self, filename: str) -> list[str | None]:
        return [r for m, p, r in self.log if m == "GET" and p.endswith("/" + filename)]

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?")[0]
        self.log.append((h.command, path, h.headers.get("Range")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+", path)
        if m and not head:
            return self.tree(h, m.group(1))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        if not m or m.group(1) not in self.repos:
            return self.send(h, 404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        files = self.repos[m.group(1)]
        if m.group(2) not in files:
            return self.send(h, 404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        self.resolve(h, m.group(2), files[m.group(2)], head)

    def tree(self, h, repo: str) -> None:
        if repo not in self.repos:
            return self.send(h, 404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        items = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest(),
                  "lfs": {"oid": hashlib.sha256(b).hexdigest(), "size": len(b), "pointerSize": 134}}
                 for n, b in self.repos[repo].items()]
        self.send(h, 200, json.dumps(items).encode(), {"Content-Type": "application/json"})

    def resolve(self, h, name: str, data: bytes, head: bool) -> None:
        sha = hashlib.sha256(b"lie" if name in self.bad_sha else data).hexdigest()
        hdr = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
               "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)), "Accept-Ranges": "bytes"}
        if head:
            return self.send(h, 200, b"", {**hdr, "Content-Length": str(len(data))}, body_sent=False)
        if self.dead_after_cut and name not in self.cut:
            return self.send(h, 500, b"down", {})
        start = int(re.match(r"bytes=(\d+)-", h.headers["Range"]).group(1)) if h.headers.get("Range") else 0
        status = 206 if start else 200
        if start:
            hdr["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        cut = self.cut.pop(name, None)
        h.send_response(status)
        for k, v in {**hdr, "Content-Length": str(len(body))}.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body[:cut] if cut is not None else body)
        h.wfile.flush()
        if cut is not None:  # the network drops mid-file
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)

    def send(self, h, status: int, body: bytes, headers: dict, body_sent: bool = True) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if "Content-Length" not in headers:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if body_sent and h.command != "HEAD":
            h.wfile.write(body)


def block_sockets(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("offline mode opened a socket")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
