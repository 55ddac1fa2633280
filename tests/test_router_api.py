"""Router mode end to end: a real `localspec serve --models-dir DIR` on a real port, its runners real
`localspec serve` processes on real GGUFs (SmolLM2 Q4_1, the registry's default, and its F16 copy in the models
folder), driven by the real `openai` and `ollama` clients and httpx.

Checks: every model listed in each protocol; a chat to each model from its own client; an unknown model is a 404
in each protocol's shape that lists the known ones; a runner killed by SIGSEGV mid-answer (the fault hook,
tests/faults/segv.py) gives an error naming the crash, streamed and not, in the llama.cpp, OpenAI and Ollama shapes
(and a stream's in Anthropic's), while the other model answers and the next request restarts the crashed one; a
caller that hangs up stops its generation; /models/load and /models/unload; Ollama's keep_alive 0; /api/pull and
/api/delete on a hub cache built here, offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

import gguf
import httpx
import numpy as np
import pytest
from faults import segv
from servers import ServerProcess

from localspec.models.registry import load_registry

pytestmark = pytest.mark.slow

MARKER = "ZQXCRASHZQX"  # a prompt holding it kills its runner by SIGSEGV after two chunks (tests/faults/segv.py)
F16 = "smol-f16"  # the models folder's file, named by its stem
HUB_REPO = "acme/tiny-GGUF"
HUB_NAME = f"{HUB_REPO}:Q8_0"
COMMIT = "c0ffee" + "0" * 34


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, smollm2_f16_path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("router")
    models = root / "models"
    models.mkdir()
    (models / f"{F16}.gguf").symlink_to(smollm2_f16_path)
    (root / "hf").mkdir()
    (root / "home").mkdir()
    return {"models": models, "hf": root / "hf", "home": root / "home"}


@pytest.fixture(scope="module")
def router(dirs, smollm2_path) -> Iterator[ServerProcess]:
    env = {**segv.env(MARKER), "HF_HUB_CACHE": str(dirs["hf"]), "HF_HUB_OFFLINE": "1",
           "LOCALSPEC_HOME": str(dirs["home"]), "LOCALSPEC_CACHE": os.environ["LOCALSPEC_CACHE"]}
    # prompt lookup with a pinned γ: the runners load without calibrating (each crash test restarts one)
    with ServerProcess(["--models-dir", str(dirs["models"]), "--models-max", "2", "--ctx", "512", "--threads",
                        "2", "--lookup", "--no-adaptive", "-k", "4"], env=env) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-30:])


@pytest.fixture(scope="module")
def smol() -> str:
    """The registry's default model (SmolLM2 Q4_1): the runner resolves it by name."""
    return load_registry().default


@pytest.fixture(scope="module")
def http(router: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router.url, timeout=600) as c:
        yield c


@pytest.fixture(scope="module")
def oai(router: ServerProcess) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def oll(router: ServerProcess) -> Any:
    ollama = pytest.importorskip("ollama")
    return ollama.Client(host=router.url, timeout=600)


def _status(http: httpx.Client, name: str) -> str:
    for m in http.get("/models").json()["data"]:
        if m["id"] == name:
            return m["status"]["value"]
    raise AssertionError(f"{name} not in /models")


def _wait_status(http: httpx.Client, name: str, want: set[str], timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while (s := _status(http, name)) not in want and time.monotonic() < deadline:
        time.sleep(0.1)
    return s


HI = [{"role": "user", "content": "Say hello."}]
CRASH = [{"role": "user", "content": f"Repeat after me: {MARKER} {MARKER} {MARKER}"}]


# -- listing --------------------------------------------------------------------------------------------------

def test_every_protocol_lists_every_model(http, oai, oll, smol):
    # a model no request has started is listed "unloaded"; in another test order one may have started it
    assert http.post("/models/unload", json={"model": F16}).json() == {"success": True}
    assert _wait_status(http, F16, {"unloaded"}) == "unloaded"
    listed = {m["id"]: m["status"]["value"] for m in http.get("/models").json()["data"]}
    assert {smol, F16} <= set(listed) and listed[F16] == "unloaded"
    assert {smol, F16} <= {m.id for m in oai.models.list().data}
    assert {smol, F16} <= {m.model for m in oll.list().models}
    props = http.get("/props").json()
    assert props["role"] == "router" and props["max_instances"] == 2


# -- answers ----------------------------------------------------------------------------------------------------

def test_each_model_answers_its_own_client(http, oai, oll, smol):
    r = oai.chat.completions.create(model=smol, messages=HI, max_tokens=6, temperature=0)
    assert r.model == smol and r.choices[0].message.content
    o = oll.chat(model=F16, messages=HI, options={"num_predict": 6, "temperature": 0})
    assert o.model == F16 and o.message.content
    assert _status(http, smol) == _status(http, F16) == "loaded"
    ps = {m.model: m for m in oll.ps().models}
    assert {smol, F16} <= set(ps) and all(m.expires_at is not None for m in ps.values())
    runner_props = http.get("/props", params={"model": F16}).json()
    assert runner_props["model"] == F16 and runner_props.get("role") != "router"


def test_a_loaded_models_answers_come_through_kept_alive_connections(http, smol):
    """The router forwards each request to its model's runner over a pooled keep-alive connection; the caller's
    own keep-alive connection carries the router's routes and both models' answers. The router's open
    descriptors do not grow with the requests."""
    for model in (smol, F16):  # both loaded
        http.post("/v1/chat/completions", json={"model": model, "messages": HI, "max_tokens": 1})
    router_pid = _router_pid(http, smol)
    fds = len(os.listdir(f"/proc/{router_pid}/fd"))
    for model in (smol, F16, smol, F16):
        r = http.post("/v1/chat/completions", json={"model": model, "messages": HI, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == model
        assert r.headers.get_list("server") == ["uvicorn"] and len(r.headers.get_list("date")) == 1  # the router's
        assert http.get("/api/ps").status_code == 200
    with http.stream("POST", "/completion", json={"model": smol, "prompt": "Hi", "n_predict": 4, "stream": True}) as s:
        assert sum(1 for ln in s.iter_lines() if ln.startswith("data: ")) >= 2
    assert len(os.listdir(f"/proc/{router_pid}/fd")) <= fds + 1


def test_a_crash_on_a_kept_alive_connection_is_an_error_and_the_next_request_starts_the_model_again(router, smol):
    """A caller's keep-alive connection: answers, then the protocol's error naming the crash, then an answer
    from the model started again, all on the same connection."""
    with httpx.Client(base_url=router.url, timeout=600) as c:
        for _ in range(2):
            r = c.post("/completion", json={"model": smol, "prompt": "Hi", "n_predict": 2})
            assert r.status_code == 200 and r.json()["content"] is not None
        crash = c.post("/completion", json={"model": smol, "prompt": f"{MARKER} {MARKER}", "n_predict": 64})
        assert crash.status_code == 502 and "SIGSEGV" in crash.json()["error"]["message"]
        assert c.post("/completion", json={"model": smol, "prompt": "Hi", "n_predict": 2}).status_code == 200


def _router_pid(http: httpx.Client, name: str) -> int:
    """The router's own process (`localspec serve` runs it under a watcher): the parent of a runner."""
    pid = next(m["status"]["pid"] for m in http.get("/models").json()["data"] if m["id"] == name)
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_unknown_model_is_a_404_in_each_protocol_listing_the_known(http, oai, oll, smol):
    openai = pytest.importorskip("openai")
    ollama = pytest.importorskip("ollama")
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="no-such-model", messages=HI, max_tokens=2)
    assert smol in str(e.value) and F16 in str(e.value)
    with pytest.raises(ollama.ResponseError) as oe:
        oll.generate(model="no-such-model", prompt="hi")
    assert oe.value.status_code == 404 and F16 in oe.value.error
    r = http.post("/completion", json={"model": "no-such-model", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error" and F16 in r.json()["error"][
        "message"]


# -- a runner that dies mid-answer ------------------------------------------------------------------------------

def _after_crash(http: httpx.Client, oai: Any, smol: str) -> None:
    """The other model answers at once, and the next request for the crashed one starts it again."""
    other = oai.chat.completions.create(model=F16, messages=HI, max_tokens=3, temperature=0)
    assert other.choices[0].message.content is not None
    again = oai.chat.completions.create(model=smol, messages=HI, max_tokens=3, temperature=0)
    assert again.choices[0].message.content is not None and _status(http, smol) == "loaded"


def test_crash_mid_stream_openai(http, oai, smol):
    openai = pytest.importorskip("openai")
    got = []
    with pytest.raises(openai.APIError) as e:
        for chunk in oai.chat.completions.create(model=smol, messages=CRASH, max_tokens=64, temperature=0,
                                                 stream=True):
            got.append(chunk)
    assert got, "the stream had started before the runner died"
    assert "SIGSEGV" in str(e.value) and smol in str(e.value)
    _after_crash(http, oai, smol)


def test_crash_whole_answer_openai(http, oai, smol):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model=smol, messages=CRASH, max_tokens=64, temperature=0)
    assert e.value.status_code == 502 and "SIGSEGV" in str(e.value)
    _after_crash(http, oai, smol)


@pytest.mark.parametrize("stream", [True, False])
def test_crash_ollama(http, oai, oll, smol, stream):
    ollama = pytest.importorskip("ollama")
    with pytest.raises(ollama.ResponseError) as e:
        answer = oll.chat(model=smol, messages=CRASH, stream=stream, options={"num_predict": 64, "temperature": 0})
        if stream:
            list(answer)
    assert e.value.error.startswith("llama runner process has terminated: ") and "SIGSEGV" in e.value.error
    if not stream:
        assert e.value.status_code == 500
    _after_crash(http, oai, smol)


@pytest.mark.parametrize("stream", [True, False])
def test_crash_llama_cpp(http, oai, smol, stream):
    body = {"model": smol, "prompt": f"{MARKER} {MARKER}", "n_predict": 64, "temperature": 0, "stream": stream}
    with http.stream("POST", "/completion", json=body) as r:
        raw = r.read().decode()
    if stream:
        assert r.status_code == 200
        events = [json.loads(ln[6:]) for ln in raw.splitlines() if ln.startswith("data: ")]
        assert "content" in events[0] and "SIGSEGV" in events[-1]["error"]["message"]
    else:
        assert r.status_code == 502 and "SIGSEGV" in json.loads(raw)["error"]["message"]
    _after_crash(http, oai, smol)


def test_anthropic_client_answers_and_sees_a_crash_as_an_error_event(http, oai, router, smol):
    anthropic = pytest.importorskip("anthropic")
    a = anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0, timeout=600)
    try:
        ok = a.messages.create(model=F16, max_tokens=4, messages=HI)
    except anthropic.NotFoundError as e:  # the runner's 404: forwarded, but not a route it serves
        pytest.skip(f"the single-model server does not serve /v1/messages yet: {e}")
    assert ok.model == F16 and ok.content
    with pytest.raises(anthropic.APIError) as e:
        with a.messages.stream(model=smol, max_tokens=64, messages=CRASH) as stream:
            for _event in stream:
                pass
    assert "SIGSEGV" in str(e.value)
    _after_crash(http, oai, smol)


# -- a caller that hangs up -------------------------------------------------------------------------------------

def _cancelled(http: httpx.Client, model: str) -> float:
    lines = http.get("/metrics", params={"model": model}).text.splitlines()
    return next(float(ln.split()[-1]) for ln in lines if ln.startswith("localspec_requests_cancelled_total"))


def test_a_caller_that_hangs_up_stops_the_runners_generation(http, router, smol):
    """llama.vim drops a whole-answer /infill at the next keystroke: the runner must stop that generation."""
    http.post("/models/load", json={"model": smol})
    assert _wait_status(http, smol, {"loaded", "failed"}) == "loaded"
    before = _cancelled(http, smol)
    no_end = {"0": False, "2": False}  # SmolLM2's <|endoftext|> and <|im_end|>: the answer cannot end by itself
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router.url + "/completion", json={"model": smol, "prompt": "Once upon a time", "n_predict": 2000,
                                                     "logit_bias": no_end}, timeout=httpx.Timeout(600, read=1.0))
    deadline = time.monotonic() + 120
    while _cancelled(http, smol) <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cancelled(http, smol) == before + 1


def test_a_caller_that_hangs_up_mid_stream_stops_the_runners_generation(http, router, smol):
    """The same for a stream the caller leaves after its first events."""
    http.post("/models/load", json={"model": smol})
    assert _wait_status(http, smol, {"loaded", "failed"}) == "loaded"
    before = _cancelled(http, smol)
    no_end = {"0": False, "2": False}
    with httpx.stream("POST", router.url + "/completion", timeout=120,
                      json={"model": smol, "prompt": "Once upon a time", "n_predict": 2000, "stream": True,
                            "logit_bias": no_end}) as r:
        events = r.iter_lines()
        assert next(e for e in events if e.startswith("data: "))  # under way; then the caller leaves
    deadline = time.monotonic() + 120
    while _cancelled(http, smol) <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cancelled(http, smol) == before + 1


# -- loading and unloading --------------------------------------------------------------------------------------

def test_models_load_and_unload(http, oll):
    assert http.post("/models/unload", json={"model": F16}).json() == {"success": True}
    assert _wait_status(http, F16, {"unloaded"}) == "unloaded"
    assert F16 not in {m.model for m in oll.ps().models}
    assert http.post("/models/load", json={"model": F16}).json() == {"success": True}
    assert _wait_status(http, F16, {"loaded", "failed"}) == "loaded"
    assert http.post("/models/load", json={"model": "no-such-model"}).status_code == 404


def test_ollama_keep_alive_zero_unloads_after_the_answer(http, oll):
    r = oll.generate(model=F16, prompt="Hi", keep_alive=0, options={"num_predict": 2})
    assert r.done
    assert _wait_status(http, F16, {"unloaded"}, timeout=30) == "unloaded"


# -- pull and delete (offline, a hub cache built here) ----------------------------------------------------------

def _cache_model(hf: Path) -> Path:
    """A tiny GGUF placed in the hub cache as huggingface-hub lays it out (blob, snapshot link, ref)."""
    repo = hf / "models--acme--tiny-GGUF"
    src = repo / "src.gguf"
    repo.mkdir(parents=True)
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_name("tiny")
    w.add_tensor("blk.0.weight", np.arange(4096, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    (repo / "blobs").mkdir()
    src.rename(repo / "blobs" / sha)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "tiny-Q8_0.gguf").symlink_to(Path("../..") / "blobs" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snap / "tiny-Q8_0.gguf"


def test_pull_then_delete_offline(http, oll, dirs):
    ollama = pytest.importorskip("ollama")
    cached = _cache_model(dirs["hf"])
    steps = list(oll.pull(HUB_NAME, stream=True))
    assert steps[0].status == "pulling manifest" and steps[-1].status == "success"
    assert any(s.digest and s.total and s.completed == s.total for s in steps)
    assert HUB_NAME in {m.model for m in oll.list().models}
    with pytest.raises(ollama.ResponseError) as e:
        list(oll.pull("acme/absent-GGUF:Q4_K_M", stream=True))
    assert "HF_HUB_OFFLINE" in e.value.error
    oll.delete(HUB_NAME)
    assert not cached.exists() and HUB_NAME not in {m.model for m in oll.list().models}
    refused = http.request("DELETE", "/api/delete", json={"model": F16})
    assert refused.status_code == 400 and "pulled" in refused.json()["error"]
