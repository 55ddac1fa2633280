"""Keystroke load: an editor sends a non-streaming /infill on every key and hangs up on the one in flight when
the next key comes. After hundreds of such requests the server still answers at once, the KV cache and the
drafter's caches are consistent (a greedy request gives its text from before the storm), and its memory has not
grown. scripts/editor/replay_editor.py --soak 1000 measures the same at 1,000 requests, with timings.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from servers import ServerProcess, rss_mib

pytestmark = pytest.mark.slow

LINES = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(40)]
TYPED = "def total(values):\n    return sum(f(v) for v in values)\n"


def body(typed: str, **extra) -> dict:
    """llama.vim's request for the cursor at the end of `typed` (the fields that shape the work)."""
    *done, cur = typed.split("\n")
    return {"id_slot": 0, "input_prefix": "".join(LINES) + "".join(d + "\n" for d in done), "prompt": cur,
            "input_suffix": "\n", "input_extra": [], "n_predict": 32, "top_k": 40, "top_p": 0.9,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
            "t_max_predict_ms": 250, "n_indent": len(cur) - len(cur.lstrip()), **extra}


GREEDY = {k: v for k, v in body("def total(values):\n    return ").items() if k not in ("samplers", "t_max_predict_ms")}
GREEDY["temperature"] = 0.0


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


async def storm(url: str, n: int, seed: int = 0) -> int:
    """n keystroke requests, each abandoned after 5-80 ms unless answered; returns how many were abandoned."""
    rng = random.Random(seed)
    abandoned = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for i in range(n):
            task = asyncio.create_task(client.post("/infill", json=body(TYPED[:i % len(TYPED) + 1])))
            await asyncio.sleep(rng.uniform(0.005, 0.08))
            if not task.done():
                task.cancel()
                abandoned += 1
            done = (await asyncio.gather(task, return_exceptions=True))[0]
            assert isinstance(done, (httpx.Response, asyncio.CancelledError)), repr(done)
            assert not isinstance(done, httpx.Response) or done.status_code == 200, done.text
    return abandoned


def test_abandoned_keystrokes_leave_the_server_consistent_and_flat(fim_model):
    with ServerProcess(["--model", str(fim_model), "--ctx", "2048"]) as srv:
        assert srv.proc is not None
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            ref = http.post("/infill", json=GREEDY).json()["content"]
            asyncio.run(storm(srv.url, 60, seed=1))  # warm: the allocator and caches reach their working size
            rss0 = rss_mib(srv.proc.pid)
            cancelled0 = metric(srv.url, "localspec_requests_cancelled_total")
            abandoned = asyncio.run(storm(srv.url, 300))
            grown = rss_mib(srv.proc.pid) - rss0
            assert abandoned > 50  # the storm did hang up on requests in flight
            # a hang-up the server saw ends its job as cancelled; one it missed had already been answered
            assert 0 < metric(srv.url, "localspec_requests_cancelled_total") - cancelled0 <= abandoned
            r = http.post("/infill", json=GREEDY)
            assert r.status_code == 200 and r.json()["content"] == ref  # caches consistent after the storm
            assert http.get("/health").json() == {"status": "ok"}
            assert grown < 32, f"RSS grew {grown:.1f} MiB over 300 abandoned requests"
        assert srv.alive
