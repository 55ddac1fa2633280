"""llama-server's --context-shift on a real `localspec serve` with a small context (256 tokens): a generation
that fills the context drops the oldest tokens after the kept head and goes on, with speculation (prompt lookup)
still drafting and verifying after the shift; without the flag the same request stops at the context."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fakes import FakeModel, counting
from servers import ServerProcess

from localspec.engine.engine import Engine
from localspec.speculative.drafters import PromptLookup
from localspec.tuning.fixed import FixedK

pytestmark = pytest.mark.slow

BODY = {"prompt": "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "n_predict": 240, "temperature": 0, "n_keep": 4}
CTX = 256  # llama.cpp pads a context to a multiple of 256: smaller ones would not be what they say


@pytest.mark.parametrize("shift", [True, False])
def test_context_shift_goes_past_the_context(smollm2_path, shift):
    args = ["--ctx", str(CTX), "--threads", "2", "--lookup", "-k", "4", "--no-adaptive"]
    with ServerProcess(args + (["--context-shift"] if shift else [])) as srv:
        assert httpx.get(srv.url + "/props", timeout=30).json()["n_ctx"] == CTX
        r = httpx.post(srv.url + "/completion", json=BODY, timeout=300).json()
        n_prompt = r["tokens_evaluated"]
        if not shift:  # llama-server's default: the context bounds prompt + answer
            assert r["tokens_predicted"] <= CTX - n_prompt + 1 and r["stop_type"] == "limit" and not r["truncated"]
            return
        assert r["tokens_predicted"] == BODY["n_predict"] > CTX - n_prompt  # past a full context, to the budget
        assert r["truncated"]  # llama-server's word for a shifted context
        with httpx.stream("POST", srv.url + "/completion", timeout=300,
                          json={**BODY, "stream": True, "timings_per_token": True}) as s:
            events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
        assert "".join(e["content"] for e in events) == r["content"]  # a shift is deterministic: greedy, same text
        at_shift = next(e["timings"]["draft_n_accepted"] for e in events if e["tokens_predicted"] > CTX - n_prompt)
        assert events[-1]["timings"]["draft_n_accepted"] > at_shift  # drafts accepted after the shift too
        chat = {"messages": [{"role": "system", "content": "Count on."}, {"role": "user", "content": BODY["prompt"]}],
                "max_tokens": 16, "temperature": 0}
        c = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=300).json()
        n = httpx.post(srv.url + "/v1/chat/completions/input_tokens", json=chat, timeout=30).json()["input_tokens"]
        assert c["usage"]["prompt_tokens"] == n  # tokenized once in the route (its system tokens): the same tokens


def test_engine_shift_keeps_the_head_and_drafts_after_it():
    """Engine level, on the scripted fake (no llama.cpp): a counting model in a 48-token context goes on for 160
    tokens; every token follows the model's rule across the shifts (the loop's KV invariant holds), the kept
    head is never dropped, and prompt lookup keeps drafting and being accepted after the first shift."""
    class Target(FakeModel):
        bos = -1
        path = Path("fake.gguf")

        def metadata(self) -> dict[str, str]:
            return {}

        def piece(self, t: int) -> bytes:
            return f"{t} ".encode()

    target = Target(counting(20), n_ctx=48)
    engine = Engine(target, PromptLookup(), controller=FixedK(4), name="fake")
    prompt = list(range(1, 11))
    out: list[int] = []
    accepted_late = 0
    for ch in engine.generate(prompt, max_tokens=160, context_shift=True, n_keep=3):
        out.extend(ch.step.tokens)
        if len(prompt) + len(out) > target.n_ctx:
            accepted_late += ch.step.accepted
        assert target.tokens[:3] == prompt[:3] and target.n_past <= target.n_ctx
    assert len(out) == 160 and ch.finish == "length"
    seq = prompt + out
    assert all(b == a % 19 + 1 for a, b in zip(seq, seq[1:]))
    assert accepted_late > 0
