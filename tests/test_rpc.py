"""`--rpc`: the model really goes to llama.cpp's RPC devices, and a bad endpoint is one line before loading.

The end-to-end tests start llama.cpp's `ggml-rpc-server` (from $LLAMA_CPP_BIN, else PATH; scripts/gpu/rpc_check.sh
builds one from the vendored sources) on a free loopback port, or without it the same server function from
llama-cpp-python; they skip only where llama-cpp-python was built without RPC. The endpoint probe tests need
neither. Anything that registers an RPC device runs in a subprocess: a registered device whose server is
gone aborts the process the next time ggml asks it for its memory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from localspec import backend
from localspec.cli import main
from localspec.errors import ModelLoadError
from localspec.models import rpc

pytestmark = pytest.mark.slow

PROMPT = "The three primary colors are"
needs_rpc = pytest.mark.skipif(not backend.supports_rpc(), reason="llama-cpp-python built without GGML_RPC")


def _localspec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True, timeout=600)


def _one_line_error(r, *needles: str) -> str:
    err = r.stderr if isinstance(r, subprocess.CompletedProcess) else r.output
    code = r.returncode if isinstance(r, subprocess.CompletedProcess) else r.exit_code
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: --rpc "), err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- endpoints, without a server ---------------------------------------------------------------------------------

def test_parse_endpoint():
    assert rpc.parse_endpoint(" 10.0.0.2:50052") == rpc.Endpoint("10.0.0.2", 50052)
    assert str(rpc.parse_endpoint("[::1]:7")) == "::1:7"
    for bad in ("nohost", ":50052", "host:", "host:0", "host:http", "host:70000"):
        with pytest.raises(ModelLoadError, match="expected HOST:PORT"):
            rpc.parse_endpoint(bad)


@needs_rpc
def test_dead_address_is_one_line_exit_2_before_loading(smollm2_path):
    r = _localspec("run", "--rpc", f"127.0.0.1:{_free_port()}", "--ngl", "-1", "-n", "4", PROMPT)
    _one_line_error(r, "cannot connect", "ggml-rpc-server")
    assert r.stdout == ""


def _serve_once(handler) -> int:
    """A loopback TCP server that hands its first connection to handler(conn); returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            handler(conn)
        srv.close()

    threading.Thread(target=run, daemon=True).start()
    return srv.getsockname()[1]


def test_not_an_rpc_server_is_one_line():
    port = _serve_once(lambda c: (c.recv(64), c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")))
    with pytest.raises(ModelLoadError, match="not a llama.cpp rpc server"):
        rpc.probe(rpc.Endpoint("127.0.0.1", port))


def test_server_that_never_answers_times_out():
    port = _serve_once(lambda c: time.sleep(2))
    with pytest.raises(ModelLoadError, match="no answer within 0.3 s"):
        rpc.probe(rpc.Endpoint("127.0.0.1", port), timeout=0.3)


def test_other_protocol_version_is_refused():
    reply = bytes([rpc.RPC_PROTO_MAJOR + 1, 0, 0, 0]) + bytes(rpc.RPC_CONN_CAPS_SIZE)
    port = _serve_once(lambda c: (c.recv(64), c.sendall(len(reply).to_bytes(8, "little") + reply)))
    with pytest.raises(ModelLoadError, match=f"speaks RPC protocol {rpc.RPC_PROTO_MAJOR + 1}.0.0"):
        rpc.probe(rpc.Endpoint("127.0.0.1", port))


@pytest.mark.parametrize("args", [("run", "-n", "1", "hi"), ("models", "show", "--device")])
def test_build_without_rpc_is_one_line(monkeypatch, smollm2_path, args):
    monkeypatch.setattr(backend.ggml, "supports_rpc", lambda: False)  # as on a default (CPU-only) build
    r = CliRunner().invoke(main, [*args, "--rpc", "127.0.0.1:50052"])
    line = _one_line_error(r, "needs llama-cpp-python built with the RPC backend")
    assert 'CMAKE_ARGS="-DGGML_RPC=on"' in line


def test_props_devices_mark_the_targets():
    from types import SimpleNamespace

    from localspec.server.protocols.llamacpp import devices_in_use

    listed = devices_in_use(SimpleNamespace(target=SimpleNamespace(offload_devices=())))
    cpu = next(d for d in listed if d["name"] == "CPU")
    assert cpu["target"] is False and cpu["total"] > 0 and cpu["type"] == "CPU"


# -- end to end, with llama.cpp's ggml-rpc-server on loopback ---------------------------------------------------

def _rpc_server_binary() -> Path | None:
    d = os.environ.get("LLAMA_CPP_BIN")
    found = Path(d) / "ggml-rpc-server" if d else shutil.which("ggml-rpc-server")
    return Path(found) if found and Path(found).exists() else None


@pytest.fixture(scope="module")
def rpc_server():
    """'127.0.0.1:PORT' of an rpc server (CPU device) running for this module: llama.cpp's ggml-rpc-server when
    it is there, else the same server function from the installed llama-cpp-python (backend.serve_rpc)."""
    if not backend.supports_rpc():
        pytest.skip("llama-cpp-python built without GGML_RPC")
    port = _free_port()
    binary = _rpc_server_binary()
    cmd = ([str(binary), "-H", "127.0.0.1", "-p", str(port)] if binary else
           [sys.executable, "-c", f"from localspec.backend import serve_rpc; serve_rpc('127.0.0.1:{port}', 2)"])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ep = rpc.Endpoint("127.0.0.1", port)
    try:
        for _ in range(100):
            try:
                rpc.probe(ep, timeout=1.0)  # also checks the protocol version localspec expects
                break
            except ModelLoadError:
                if proc.poll() is not None:
                    pytest.fail(f"ggml-rpc-server exited with {proc.returncode}")
                time.sleep(0.1)
        yield str(ep)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_show_device_lists_the_rpc_device_with_memory(rpc_server):
    r = _localspec("models", "show", "--device", "--rpc", rpc_server, "--json")
    assert r.returncode == 0, r.stderr
    remote = [d for d in json.loads(r.stdout)["device"]["devices"] if d["backend"] == "RPC"]
    assert len(remote) == 1 and remote[0]["description"] == rpc_server and remote[0]["total"] > 0
    text = _localspec("models", "show", "--device", "--rpc", rpc_server).stdout
    assert f"rpc server {rpc_server}" in text


def test_ngl_all_puts_the_model_on_the_rpc_device_and_greedy_text_is_unchanged(rpc_server, smollm2_path):
    # threads pinned: a run-time thread switch may move a near-tie token (not what this test is about)
    common = ("run", "--no-spec", "--json", "-n", "24", "--ctx", "512", "--threads", "2", PROMPT)
    local = _localspec(*common)
    remote = _localspec(*common, "--rpc", rpc_server, "--ngl", "-1", "--verbose")
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr[-2000:]
    log = remote.stderr
    assert f"RPC0[{rpc_server}] model buffer size" in log  # weights on the server
    assert f"RPC0[{rpc_server}] KV buffer size" in log  # the KV cache goes with the layers
    assert "assigned to device RPC0" in log and "assigned to device CPU" not in log  # every layer, output too
    assert json.loads(remote.stdout)["text"] == json.loads(local.stdout)["text"]


def test_the_drafter_stays_local(rpc_server, smollm2_path, smollm2_f16_path):
    r = _localspec("run", "--json", "-n", "16", "--ctx", "512", "--model", str(smollm2_f16_path),
                   "--draft", "smollm2-135m", "--rpc", rpc_server, "--ngl", "-1", "--verbose", PROMPT)
    assert r.returncode == 0, r.stderr[-2000:]
    # two models load; only the target's weights go to the server
    assert r.stderr.count(f"RPC0[{rpc_server}] model buffer size") == 1
    out = json.loads(r.stdout)
    assert out["drafter"] == "smollm2-135m" and out["tokens"] == 16
    assert len(out["v"]) > 1  # the controller's v(γ), measured over the network
