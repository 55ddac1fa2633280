"""llama-server details its own tests check (tools/server/tests/unit): `/slots` (test_basic's test_server_slots,
test_metrics' idle slot, the cancellation tests' busy slot), object prompts (`{"prompt_string": ...}`), the
generation rate over n-1 steps (test_metrics_generation_rate_excludes_first_token) and `timings` on progress
events (test_metrics_timings_on_prompt_progress). One SmolLM2 served in this process (tests/inprocess.py).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

import httpx
import pytest
from inprocess import load, serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = load(smollm2_path, n_batch=64)
    yield e
    e.close()


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serving(engine) as u:
        yield u


def test_slots_idle_busy_and_off(url, engine):
    idle = httpx.get(url + "/slots").json()
    assert len(idle) == 1 and idle[0]["is_processing"] is False and idle[0]["n_ctx"] == 2048
    assert "params" not in idle[0] and "next_token" not in idle[0]
    seen: list = []

    def look() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen:
            s = httpx.get(url + "/slots").json()[0]
            if s["is_processing"]:
                seen.append(s)
                seen.append(httpx.get(url + "/slots?fail_on_no_slot=1").status_code)
            time.sleep(0.01)

    watcher = threading.Thread(target=look)
    watcher.start()
    body = {"prompt": "Once upon a time", "n_predict": 48, "temperature": 0}
    assert httpx.post(url + "/completion", json=body, timeout=300).status_code == 200
    watcher.join()
    busy, status = seen
    assert busy["id_task"] > 0 and busy["n_prompt_tokens"] > 0 and status == 503
    assert busy["next_token"][0]["n_decoded"] + busy["next_token"][0]["n_remain"] == 48
    assert httpx.get(url + "/slots").json()[0]["is_processing"] is False
    props = httpx.get(url + "/props").json()
    assert props["endpoint_slots"] is True and props["total_slots"] == 1
    with serving(engine, slots=False) as off:  # another app on the same engine: only /slots is asked
        r = httpx.get(off + "/slots")
        assert r.status_code == 501 and "--slots" in r.json()["error"]["message"]


def test_object_prompts(url):
    one = httpx.post(url + "/completion", json={"prompt": {"prompt_string": "I believe"}, "n_predict": 2})
    assert one.status_code == 200 and one.json()["tokens_evaluated"] > 1
    two = httpx.post(url + "/completion", json={"prompt": ["I believe", {"prompt_string": "The sky"}], "n_predict": 2})
    assert [r["index"] for r in two.json()] == [0, 1]
    media = {"prompt_string": "What is this: <__media__>", "multimodal_data": ["iVBORw0KGgo="]}
    assert httpx.post(url + "/completion", json={"prompt": media, "n_predict": 2}).status_code == 400


def test_generation_rate_is_over_the_steps_after_the_first_token(url):
    t = httpx.post(url + "/completion", json={"prompt": "Once upon a time", "n_predict": 16, "temperature": 0},
                   timeout=120).json()["timings"]
    n = t["predicted_n"]
    assert n > 2 and abs(t["predicted_per_second"] - 1e3 / t["predicted_ms"] * (n - 1)) < 1e-6
    one = httpx.post(url + "/completion", json={"prompt": "I believe", "n_predict": 1}, timeout=120).json()["timings"]
    assert one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0


def test_progress_events_carry_timings(url):
    body = {"prompt": f"{time.time()} " + "the quick brown fox jumps over the lazy dog " * 16, "n_predict": 4,
            "stream": True, "timings_per_token": True, "return_progress": True}
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) > 1  # the prompt did not fit one batch of 64
    first = progress[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    ms = [c["timings"]["prompt_ms"] for c in progress]
    assert ms == sorted(ms) and ms[-1] > 0
    assert all(v is not None and v >= 0 for c in progress for v in c["timings"].values())
