"""The hostile-input soak: every class of request that killed, held or walked past a `localspec serve` (see
docs/bench/soak.md#hostile-requests), thrown at a real server on loopback, one class after another.

For each class: the statuses it got, the time it took, the server's resident memory (its process tree) and open
descriptors before and after, and whether the server still answered /health and a small generation after it.
Router mode adds the runner walk-around (a local client straight to a runner's port, with and without keys).

Usage: python scripts/soak/hostile.py [--mode single|router] [--big-mb 50] [--out FILE.json]
Prints the Markdown table docs/bench/soak.md holds.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
sys.path.insert(0, str(HERE))
from servers import ServerProcess  # noqa: E402  (the tests' helper: a real `localspec serve` on a free port)
from soak_procs import descendants, sample  # noqa: E402

KEY = "hostile-soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SMALL = {"prompt": "Hello", "n_predict": 2}
Case = Callable[[str], list[int]]


def _post(url: str, path: str, body: dict | bytes, timeout: float = 600, headers: dict | None = None) -> int:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    try:
        return httpx.post(url + path, headers={**AUTH, **(headers or {})}, timeout=timeout, **kw).status_code
    except httpx.TimeoutException:
        return 0  # the client hung up
    except httpx.TransportError:
        return -1  # the server closed the connection


def _grammar(g: str) -> Case:
    return lambda url: [_post(url, p, b) for p, b in (
        ("/completion", {"prompt": "x", "n_predict": 4, "grammar": g}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "grammar": g}))]


def _schema(schema: dict, timeout: float = 600) -> Case:
    return lambda url: [_post(url, "/completion", {"prompt": "x", "n_predict": 4, "json_schema": schema}, timeout)]


def _hang_up(url: str) -> list[int]:
    """An enum of 1000 values (the widest grammar the bounds let through) whose client hangs up after 1 s, then
    how long the next small answer takes (the worker frees itself first)."""
    out = _schema({"enum": [f"value {i}" for i in range(1000)]}, timeout=1.0)(url)
    start = time.monotonic()
    status = _post(url, "/completion", SMALL)
    return out + [status, 1000 + int((time.monotonic() - start) * 1000)]


def _kwargs(url: str) -> list[int]:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "chat_template_kwargs": {"messages": "x"}}
    return [_post(url, p, body) for p in ("/v1/chat/completions", "/apply-template")]


def _big(mb: int) -> Case:
    return lambda url: [_post(url, "/completion", b'{"prompt": "' + b"x" * (mb << 20) + b'", "n_predict": 1}')]


def _tokenize(url: str) -> list[int]:
    """5 MB to /tokenize, and /health's status and latency while it runs (status 1000 + ms, for the table)."""
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(_post(url, "/tokenize", {"content": "word " * (1 << 20)})))
    t.start()
    time.sleep(0.5)
    start = time.monotonic()
    health = httpx.get(url + "/health", timeout=600).status_code
    ms = int((time.monotonic() - start) * 1000)
    t.join()
    return out + [health, 1000 + ms]


def _half_sent(url: str, n: int = 50, wait: float = 15.0) -> list[int]:
    """n connections that send part of a head; how many the server closed within `wait` seconds."""
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(n)]
    for i, s in enumerate(socks):
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"GET /hea")
        s.settimeout(wait)
    closed = 0
    for s in socks:
        try:
            closed += s.recv(1) == b""
        except OSError:
            pass
        s.close()
    return [closed]


def _deep_json(url: str) -> list[int]:
    return [_post(url, "/completion", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
            _post(url, "/completion", b'{"prompt": "\xff\xfe", "n_predict": 1}'),
            _post(url, "/completion", b'{"prompt": "a\\u0000b", "n_predict": 1}')]


CASES: dict[str, Case] = {
    "grammar {5,1} (was: OOM kill)": _grammar('root ::= "a"{5,1}'),
    "grammar {1,0}": _grammar('root ::= "a"{1,0}'),
    "grammar (\"a\"?) x2000 (was: worker held > 7 min)": _grammar("root ::= " + " ".join(['("a"?)'] * 2000)),
    "grammar 50k alternatives (was: 49 s)": _grammar("root ::= " + " | ".join(f'"w{i}"' for i in range(50_000))),
    "grammar \\U99999999 (was: 500)": _grammar('root ::= "\\U99999999"'),
    "schema enum 10k (was: 23 s)": _schema({"enum": [f"value {i}" for i in range(10_000)]}),
    "schema enum 1000, hang-up at 1 s; then 1000+ms of a 2-token answer": _hang_up,
    "chat_template_kwargs messages (was: 500)": _kwargs,
    "tokenize 5 MB: status, /health, 1000+ms": _tokenize,
    "deep JSON, bad UTF-8, NUL": _deep_json,
    "half-sent heads x50: closed in 15 s": _half_sent,
}


def _state(srv: ServerProcess) -> tuple[float, int]:
    """RSS (MiB) and open descriptors of the server's process tree."""
    assert srv.proc is not None
    samples = [s for p in [srv.proc.pid, *descendants(srv.proc.pid)] if (s := sample("p", p))]
    return round(sum(s.rss_mib for s in samples), 1), sum(s.fds for s in samples)


def _alive(url: str) -> bool:
    try:
        return (httpx.get(url + "/health", timeout=60).status_code == 200
                and httpx.post(url + "/completion", json={"model": "smollm2-135m", **SMALL}, headers=AUTH,
                               timeout=600).status_code == 200)
    except httpx.HTTPError:
        return False


def _runner_walk(srv: ServerProcess) -> list[int]:
    """Router mode: straight to a runner's port, without a key, with the router's, and its /health."""
    urls = [m.group(1) for line in srv.log if (m := re.search(r"loaded \(pid \d+, (http://[\d.:]+)\)", line))]
    if not urls:
        return []
    r = urls[-1]
    return [httpx.post(r + "/completion", json=SMALL, timeout=60).status_code,
            httpx.post(r + "/completion", json=SMALL, headers=AUTH, timeout=60).status_code,
            httpx.get(r + "/v1/models", timeout=60).status_code, httpx.get(r + "/health", timeout=60).status_code]


def run(mode: str, big_mb: int) -> list[dict]:
    args = ["--api-key", KEY, "--ctx", "1024", "--threads", "1"]
    env: dict[str, str] = {}
    if mode == "router":  # the embedded model alone, in a runner (as tests/test_hostile_router.py starts one)
        tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
        (tmp / "models").mkdir()
        args = ["--models-dir", str(tmp / "models"), "--models-max", "1", *args]
        from localspec.models.paths import cache_dir  # model files stay shared, as tests/conftest.py keeps them

        env = {"HF_HUB_CACHE": str(tmp / "hf"), "HF_HUB_OFFLINE": "1", "LOCALSPEC_HOME": str(tmp / "home"),
               "LOCALSPEC_CACHE": str(cache_dir())}
    cases = dict(CASES, **{f"/completion body {big_mb} MB (was: 5.4 GB peak)": _big(big_mb)})
    if mode == "router":
        cases["runner without the router's secret"] = lambda url: []  # filled below, once a runner is up
    rows = []
    with ServerProcess(args, env=env) as srv:
        assert _alive(srv.url)
        for name, case in cases.items():
            rss0, fd0 = _state(srv)
            start = time.monotonic()
            statuses = _runner_walk(srv) if name.startswith("runner") else case(srv.url)
            seconds = round(time.monotonic() - start, 2)
            rss1, fd1 = _state(srv)
            row = {"class": name, "statuses": statuses, "s": seconds, "rss_mib": [rss0, rss1], "fds": [fd0, fd1],
                   "alive_after": _alive(srv.url)}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def markdown(mode: str, rows: list[dict], load: str) -> str:
    out = [f"### {mode} mode ({load})", "",
           "| class | statuses | s | RSS MiB before → after | fds before → after | alive after |",
           "|---|---|---:|---|---|---|"]
    for r in rows:
        out.append(f"| {r['class']} | {' '.join(map(str, r['statuses']))} | {r['s']} | {r['rss_mib'][0]} → "
                   f"{r['rss_mib'][1]} | {r['fds'][0]} → {r['fds'][1]} | {'yes' if r['alive_after'] else 'NO'} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("single", "router"), default="single")
    ap.add_argument("--big-mb", type=int, default=50)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    load = "load average " + Path("/proc/loadavg").read_text().split(" ", 1)[0] + " at start"
    rows = run(a.mode, a.big_mb)
    if a.out:
        a.out.write_text(json.dumps({"mode": a.mode, "rows": rows}, indent=1))
    print(markdown(a.mode, rows, load))
    if not all(r["alive_after"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
