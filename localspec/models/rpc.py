"""llama.cpp RPC endpoints: parse `HOST:PORT` and probe the server before llama.cpp connects to it.

llama.cpp's RPC client aborts the whole process (GGML_ABORT, no exception) when an endpoint cannot be reached
or answers the handshake wrongly, so every endpoint is checked here first, in Python, with a short timeout: a
TCP connect, then the protocol's HELLO exchange. What is wrong comes back as one line (ModelLoadError, exit 2).

The HELLO wire format (ggml/src/ggml-rpc/ggml-rpc.cpp of the llama.cpp that llama-cpp-python vendors):
request  = cmd u8 (RPC_CMD_HELLO = 14, fixed across versions) | size u64 | conn_caps[24] (all zero: plain TCP)
response = size u64 | major u8 | minor u8 | patch u8 | pad u8 | conn_caps[24]
The server serves one client at a time and closes the probe's connection when it is closed here.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Sequence

from ..errors import ModelLoadError

PROBE_TIMEOUT_S = 3.0
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
RPC_PROTO_MAJOR = 7  # llama-cpp-python 0.3.36's vendored ggml-rpc (tests/test_rpc.py checks it live)
START_HINT = "start llama.cpp's ggml-rpc-server there (docs/models.md, 'More than one machine')"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """`HOST:PORT` as llama.cpp's parse_endpoint reads it (the port after the last ':')."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ModelLoadError(f"--rpc {text!r}: expected HOST:PORT, e.g. 10.0.0.2:50052")
    return Endpoint(host, int(port))


def parse_endpoints(texts: Sequence[str]) -> list[Endpoint]:
    return [parse_endpoint(t) for t in texts]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def hello(ep: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """The server's protocol version (major, minor, patch); ModelLoadError with one line when it has none."""
    try:
        with socket.create_connection((ep.host, ep.port), timeout=timeout) as s:
            s.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            head = _recv_exact(s, 8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            body = _recv_exact(s, size) if 4 <= size <= 4096 else b""
    except socket.timeout:
        raise ModelLoadError(f"--rpc {ep}: no answer within {timeout:g} s; is the address right and "
                             f"ggml-rpc-server running? ({START_HINT})") from None
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ModelLoadError(f"--rpc {ep}: cannot connect ({why}); {START_HINT}") from None
    if len(body) < 4:
        raise ModelLoadError(f"--rpc {ep}: not a llama.cpp rpc server, or one from another llama.cpp version "
                             "(no answer to the RPC handshake); build ggml-rpc-server from the llama.cpp that "
                             "llama-cpp-python vendors (docs/models.md)")
    return body[0], body[1], body[2]


def probe(ep: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Refuse, with one line, an endpoint llama.cpp's client would abort on."""
    major, minor, patch = hello(ep, timeout)
    if major != RPC_PROTO_MAJOR:
        raise ModelLoadError(f"--rpc {ep}: the rpc server speaks RPC protocol {major}.{minor}.{patch}, this "
                             f"llama-cpp-python speaks {RPC_PROTO_MAJOR}.x; build ggml-rpc-server from the "
                             "llama.cpp that llama-cpp-python vendors (docs/models.md)")
