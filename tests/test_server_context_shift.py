"""llama-server's --context-shift on a real `localspec serve` with a small context (256 tokens): a generation
that fills the context drops the oldest tokens after the kept head and goes on, with speculation (prompt lookup)
still drafting and verifying after the shift; without the flag the same request stops at the context."""

from __future__ import annotations

import httpx
import pytest

from localspec.server.testing import ServerProcess

BODY = {"prompt": "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "n_predict": 300, "temperature": 0, "n_keep": 4}


@pytest.mark.parametrize("shift", [True, False])
def test_context_shift_goes_past_the_context(smollm2_path, shift):
    args = ["--ctx", "256", "--threads", "2", "--lookup", "-k", "4", "--no-adaptive"]
    with ServerProcess(args + (["--context-shift"] if shift else [])) as srv:
        r = httpx.post(srv.url + "/completion", json=BODY, timeout=300).json()
        n_prompt = r["tokens_evaluated"]
        if not shift:  # llama-server's default: the context bounds prompt + answer
            assert r["tokens_predicted"] <= 256 - n_prompt + 1 and r["stop_type"] == "limit"
            return
        assert r["tokens_predicted"] > 256 - n_prompt  # went on past a full context
        assert r["timings"]["draft_n_accepted"] > 0  # speculation drafted and was verified
        again = httpx.post(srv.url + "/completion", json=BODY, timeout=300).json()
        assert again["content"] == r["content"]  # a shift is deterministic: greedy gives the same text
        assert httpx.post(srv.url + "/completion", json={"prompt": "Hi", "n_predict": 3}, timeout=60).status_code == 200
