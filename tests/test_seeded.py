"""One seed, one text: a seeded request emits the same tokens with speculation off, with prompt
lookup, with a model drafter and with the adaptive default, streamed or not, greedy or sampled.

The verify rule for these drafts (verify.verify_same_seed) samples every position from the target's own row with
one `rng.random()`, as plain decoding does, and keeps a draft token only when it equals that sample; the model
drafter drafts at the uniforms the target will draw (drafters.ModelDrafter, "coupled"). So the random stream is
plain decoding's whatever is drafted, however long the drafts, and whether the controller speculates or not.
What remains is numerics: a batched verify row's logits differ from a single decode's in the last bits, which
could move a token only where a draw lands within ~1e-6 of a boundary of its CDF (or at a greedy near-tie).

The engine tests run the loop on real SmolLM2; the server tests start real `localspec serve` processes on port
0 and ask them with the `openai` client and with httpx.
"""

from __future__ import annotations

import json
from typing import Iterator, Sequence

import httpx
import numpy as np
import pytest
from servers import ServerProcess

from localspec.engine.engine import Engine
from localspec.sampling.constrain import Constraint
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import ModelDrafter, PromptLookup
from localspec.speculative.loop import generate
from localspec.speculative.types import Step
from localspec.tuning.fixed import FixedK

pytestmark = pytest.mark.slow

PROMPT = "I believe the meaning of life is"
COPY = ("<|im_start|>user\nRepeat this list exactly:\n- apples, pears and plums\n- bread, butter and jam\n"
        "- tea, coffee and milk<|im_end|>\n<|im_start|>assistant\n- apples, pears")  # lookup drafts here
PARAMS = {
    "greedy": SamplingParams(),
    "issue": SamplingParams(temperature=0.2, top_k=5, seed=4242),
    "warm": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=42),
    "temperature-only": SamplingParams(temperature=0.8, seed=7),
    "penalised": SamplingParams(temperature=0.7, top_k=20, repeat_penalty=1.3, seed=3),
}


class Alternating:
    """A controller that turns speculation on and off every other round (as Adaptive may mid-request)."""

    def __init__(self, k: int) -> None:
        self.k, self.rounds = k, 0

    def choose_k(self) -> int:
        self.rounds += 1
        return self.k if self.rounds % 2 else 0

    def k_for(self, source: str) -> int:
        return self.k

    def observe(self, step: Step) -> None:
        pass


def _tokens(target, prompt: Sequence[int], params: SamplingParams, n: int = 48, **kw) -> tuple[list[int], int]:
    out: list[int] = []
    drafted = 0
    for step in generate(target, prompt, params=params, max_tokens=n, **kw):
        out += step.tokens
        drafted += step.drafted
    return out, drafted


@pytest.mark.parametrize("name", list(PARAMS))
def test_engine_same_tokens_with_every_drafter(smollm2_target, smollm2_twin, name: str):
    t = smollm2_target
    params = PARAMS[name]
    for text in (PROMPT, COPY):
        prompt = t.tokenize(text, add_special=True, parse_special=True)
        plain, _ = _tokens(t, prompt, params)
        runs = {"lookup": dict(drafter=PromptLookup(), controller=FixedK(4)),
                "lookup on/off": dict(drafter=PromptLookup(), controller=Alternating(6)),
                "model": dict(drafter=ModelDrafter(smollm2_twin), controller=FixedK(3)),
                "model greedy-drafted": dict(drafter=ModelDrafter(smollm2_twin, draw="greedy"),
                                             controller=FixedK(2))}
        for label, kw in runs.items():
            got, drafted = _tokens(t, prompt, params, **kw)
            assert got == plain, f"{label}, {name}: speculation changed the seeded text"
            if label.startswith("model") or text is COPY:
                assert drafted > 0, label
        again, _ = _tokens(t, prompt, params, drafter=PromptLookup(), controller=FixedK(4))
        assert again == plain  # the KV cache reused from the run before changes nothing


def test_engine_constrained_seeded_text_is_the_same(smollm2_target, smollm2_twin):
    """A logit_bias constraint applied to p and q alike: the stream is still one draw per emitted token."""
    t = smollm2_target
    prompt = t.tokenize(COPY, add_special=True, parse_special=True)
    ban = t.tokenize(" bread", add_special=False)[0]
    params = SamplingParams(temperature=0.8, top_k=40, seed=11)

    def run(**kw) -> list[int]:
        p = SamplingParams(**{**params.__dict__, "constraint": Constraint(t.n_vocab, bias={ban: -np.inf})})
        return _tokens(t, prompt, p, **kw)[0]

    plain = run()
    assert ban not in plain
    assert run(drafter=PromptLookup(), controller=FixedK(4)) == plain
    assert run(drafter=ModelDrafter(smollm2_twin), controller=FixedK(3)) == plain


def test_engine_generate_text_is_the_same(smollm2_target):
    """Engine.generate (the text layer every front end uses), spec on and off."""
    e = Engine(smollm2_target, PromptLookup(), controller=FixedK(4))
    params = PARAMS["warm"]
    texts = ["".join(c.text for c in e.generate(COPY, params=params, max_tokens=40, speculate=spec))
             for spec in (False, True, True)]
    assert texts[0] == texts[1] == texts[2] and texts[0]


# -- servers ------------------------------------------------------------------------------------------------------

SERVERS = {
    "plain": ["--no-spec"],
    "lookup": ["--lookup", "--no-adaptive", "-k", "4"],
    "model": ["--draft", "{f16}", "--no-adaptive", "-k", "3"],
    "adaptive": [],  # the default: prompt lookup, the adaptive controller
}
BODIES = {  # llama-server's /completion
    "issue": {"prompt": PROMPT, "temperature": 0.2, "top_k": 5, "seed": 4242, "n_predict": 16,
              "return_tokens": True},
    "warm": {"prompt": PROMPT, "n_predict": 16, "temperature": 0.8, "seed": 42, "return_tokens": True},
    "copy": {"prompt": COPY, "n_predict": 32, "temperature": 0.8, "seed": 5, "return_tokens": True},
    "greedy": {"prompt": COPY, "n_predict": 32, "temperature": 0, "return_tokens": True},
}


@pytest.fixture(scope="module")
def servers(smollm2_path, smollm2_f16_path) -> Iterator[dict[str, ServerProcess]]:
    procs: dict[str, ServerProcess] = {}
    try:
        for name, args in SERVERS.items():
            args = [a.replace("{f16}", str(smollm2_f16_path)) for a in args]
            procs[name] = ServerProcess(["--ctx", "1024", "--threads", "2", *args]).__enter__()
        yield procs
        for name, p in procs.items():
            assert p.alive, name + ": " + "".join(p.log[-20:])
    finally:
        for p in procs.values():
            p.stop()


def _completion(url: str, body: dict, stream: bool) -> tuple[list[int], str, dict]:
    with httpx.Client(base_url=url, timeout=120) as c:
        if not stream:
            r = c.post("/completion", json=body)
            assert r.status_code == 200, r.text
            d = r.json()
            return d["tokens"], d["content"], d
        tokens, text, last = [], "", {}
        with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
            for ln in r.iter_lines():
                if ln.startswith("data: "):
                    last = json.loads(ln[6:])
                    tokens += last["tokens"]
                    text += last["content"]
        assert last.get("stop") is True
        return tokens, text, last


def test_server_completion_same_tokens_everywhere(servers):
    """llama-server's /completion over httpx: every server, streamed and not, twice (the second time with a warm
    controller and the cross-request suffix cache), gives the plain server's tokens."""
    drafted = {name: 0 for name in servers}
    for bname, body in BODIES.items():
        want, want_text, _ = _completion(servers["plain"].url, body, False)
        assert want, bname  # sampled answers may end early (EOS); what counts is that every server agrees
        for name, srv in servers.items():
            for stream in (False, True, False, True):
                got, text, last = _completion(srv.url, body, stream)
                assert (got, text) == (want, want_text), f"{name} {bname} stream={stream}"
                drafted[name] += last["timings"]["draft_n"]
    assert drafted["plain"] == 0 and drafted["lookup"] > 0 and drafted["model"] > 0


def test_server_openai_client_same_text_everywhere(servers):
    """The real `openai` client: completions and chat, seeded and sampled or greedy, streamed and not."""
    openai = pytest.importorskip("openai")
    cases = [("completion", dict(prompt=COPY, max_tokens=32, temperature=0.8, seed=42)),
             ("completion", dict(prompt=PROMPT, max_tokens=24, temperature=0)),
             ("chat", dict(messages=[{"role": "user", "content": "Write a haiku about the sea."}], max_tokens=32,
                           temperature=0.9, top_p=0.9, seed=1234))]

    def ask(url: str, kind: str, kw: dict, stream: bool) -> str:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        if kind == "completion":
            if not stream:
                return client.completions.create(model="m", **kw).choices[0].text
            return "".join(ev.choices[0].text for ev in client.completions.create(model="m", stream=True, **kw)
                           if ev.choices)
        if not stream:
            return client.chat.completions.create(model="m", **kw).choices[0].message.content
        return "".join(ev.choices[0].delta.content or "" for ev in
                       client.chat.completions.create(model="m", stream=True, **kw) if ev.choices)

    for kind, kw in cases:
        want = ask(servers["plain"].url, kind, kw, False)
        assert want
        for name, srv in servers.items():
            for stream in (False, True):
                assert ask(srv.url, kind, kw, stream) == want, f"{name} {kind} {kw} stream={stream}"
