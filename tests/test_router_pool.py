"""Router mode's runners and pool: real `localspec serve` child processes on SmolLM2 (started, health-checked,
crashed by the SIGSEGV fault hook mid-answer, restarted, evicted, unloaded, put to sleep, never left a zombie
or an orphan), and the pure parts beside them: the catalog's names and presets, the memory estimate, the
refusals that happen before any process starts."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from faults import segv
from faults.segv import FAULT_ENV

from localspec.crash import WATCH_ENV, crash_line
from localspec.models.footprint import footprint
from localspec.router.discover import (
    GLOBAL_SECTION,
    ModelSpec,
    canonical,
    discover,
    engine_args,
    preset_args,
    read_presets,
)
from localspec.router.memory import PROCESS_BYTES, Estimate, estimate
from localspec.router.pool import FAILED, LOADED, SLEEPING, UNLOADED, Pool
from localspec.router.process import Runner, exit_cause
from localspec.router.refusals import RunnerFailed, UnknownModel, WontFit

MARKER = "ZQX-CRASH-HERE"
RUNNER_ARGS = ("--no-spec", "--ctx", "256", "--threads", "1")


def _spec(name: str, path: Path) -> ModelSpec:
    return ModelSpec(name, path, ("--model", str(path), *RUNNER_ARGS), "models dir", n_ctx=256, ngl=0)


def _gone(pid: int, *, zombie_ok: bool = False, wait: float = 15.0) -> bool:
    """The process has left the process table (a zombie counts only with zombie_ok: an orphan's is init's)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if zombie_ok and state == "Z":
            return True
        time.sleep(0.05)
    return False


def _peak_resident(pid: int) -> int:
    """VmHWM: the most memory the process has had resident, in bytes."""
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_exit_cause_names_a_crash_a_kill_and_an_exit():
    assert exit_cause(-signal.SIGSEGV, "x") == crash_line(signal.SIGSEGV)
    assert exit_cause(-signal.SIGKILL, "") == crash_line(signal.SIGKILL)
    assert exit_cause(-signal.SIGTERM, "") == "runner killed by SIGTERM"
    assert exit_cause(2, "error: model file not found") == "runner exited with code 2: error: model file not found"


async def test_a_runners_crash_names_the_suspect_the_runner_noted():
    """A runner that noted what it runs on a GPU device (devicefa.py) and then crashed is blamed for that, not
    for the CPU's fast paths, and every caller reads the same line (the note is taken once)."""
    code = ("import os, signal; from localspec.crash import note_suspect; "
            "note_suspect('flash attention on Vulkan0', '--flash-attn off'); os.kill(os.getpid(), signal.SIGSEGV)")

    class Crashing(Runner):
        @property
        def command(self) -> list[str]:
            return [sys.executable, "-c", code]

    runner = Crashing("fa", ())
    with pytest.raises(RunnerFailed, match="most likely in flash attention on Vulkan0: try again with --flash-attn"):
        await runner.start()
    assert "AMX" not in runner.failure() and runner.failure() == await runner.died()


def test_a_runner_runs_unwatched_and_without_the_routers_api_key(monkeypatch):
    monkeypatch.setenv("LOCALSPEC_API_KEY", "secret")
    r = Runner("tiny", ("--model", "x.gguf"), env={FAULT_ENV: MARKER})
    # not the router's key: a secret of its own, which only the router sends (a local client without it gets 401)
    assert r.env["LOCALSPEC_API_KEY"] == r.secret != "secret" and r.env[WATCH_ENV] == "1" and r.env[FAULT_ENV] == MARKER
    assert r.command[1:4] == ["-m", "localspec", "serve"]  # the command a user runs, nothing more
    assert r.command[-6:] == ["--host", "127.0.0.1", "--port", "0", "--model", "x.gguf"]
    assert not r.alive and r.failure() is None and r.pid is None


def test_without_its_variable_the_fault_hook_installs_nothing(monkeypatch):
    from localspec.engine.engine import Engine

    monkeypatch.delenv(FAULT_ENV, raising=False)
    before = Engine.generate
    segv.install_from_env()
    assert Engine.generate is before


def test_presets_read_llama_server_keys_from_ini_and_toml(tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text("[*]\nthreads = 2\n\n[coder]\nmodel = /m/coder.gguf\nctx-size = 2048\nn-gpu-layers = -1\n"
                   "model-draft = /m/small.gguf\nno-spec = false\nlookup = true\n")
    sections = read_presets(ini)
    assert preset_args(sections[GLOBAL_SECTION]) == ("--threads", "2")
    assert preset_args(sections["coder"]) == ("--ctx", "2048", "--ngl", "-1", "--draft", "/m/small.gguf", "--lookup")
    toml = tmp_path / "models.toml"
    toml.write_text('[coder]\nmodel = "/m/coder.gguf"\nctx = 1024\nno_spec = true\n')
    assert preset_args(read_presets(toml)["coder"]) == ("--ctx", "1024", "--no-spec")


def test_canonical_names_take_ollama_tags_aliases_and_a_hub_repo_without_quant():
    specs = {s.name: s for s in (ModelSpec("tiny", None, ()), ModelSpec("o/r:Q4_K_M", None, ()),
                                 ModelSpec("coder", None, (), aliases=("qwen",)))}
    assert canonical("tiny:latest", specs) == "tiny"
    assert canonical("qwen", specs) == "coder"
    assert canonical("o/r", specs) == "o/r:Q4_K_M"
    assert canonical("nope", specs) is None


def test_discover_names_models_dir_files_by_stem_and_hub_files_by_repo_and_quant(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("LOCALSPEC_MODELS_DIR", raising=False)
    from localspec.engine.loader import EngineConfig

    d = tmp_path / "models"
    d.mkdir()
    for n in ("tiny.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "mmproj-tiny.gguf"):
        (d / n).write_bytes(b"GGUF")
    snap = tmp_path / "hf" / "models--owner--Repo-GGUF" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "repo-Q4_K_M.gguf").write_bytes(b"GGUF")
    specs = discover(EngineConfig(models_dirs=(str(d),), n_ctx=512, threads=2, ngl=None))
    assert {"tiny", "big", "owner/Repo-GGUF:Q4_K_M"} <= set(specs)
    assert not any("mmproj" in n or "00002" in n for n in specs)
    tiny = specs["tiny"]
    assert tiny.args[:2] == ("--model", str(d / "tiny.gguf")) and tiny.source == "models dir"
    assert {"--ctx", "512", "--threads", "2"} <= set(tiny.args) and "--models-dir" in tiny.args
    default = next(s for s in specs.values() if s.source == "models.toml")
    assert default.args[:2] == ("--model", default.name)  # the runner resolves the registry pair itself


def test_a_preset_pairs_a_file_with_a_drafter_and_its_own_options(tmp_path, monkeypatch, smollm2_path):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("LOCALSPEC_MODELS_DIR", raising=False)
    from localspec.engine.loader import EngineConfig

    presets = tmp_path / "presets.ini"
    presets.write_text(f"[*]\nthreads = 2\n\n[paired]\nmodel = {smollm2_path}\nmodel-draft = {smollm2_path}\n"
                       "ctx-size = 512\n")
    specs = discover(EngineConfig(n_ctx=1024, ngl=None), presets)
    paired = specs["paired"]
    assert paired.source == "preset" and paired.path == smollm2_path and paired.draft_path == smollm2_path
    assert paired.args[:2] == ("--model", str(smollm2_path)) and paired.n_ctx == 512
    assert paired.args[-6:] == ("--threads", "2", "--draft", str(smollm2_path), "--ctx", "512")  # the section last
    assert all(s.args[-2:] == ("--threads", "2") for s in specs.values() if s.source != "preset")  # [*] for all
    one = estimate(smollm2_path, 512, 0)
    assert estimate(smollm2_path, 512, 0, draft=smollm2_path).ram_bytes == 2 * one.ram_bytes - PROCESS_BYTES


async def test_update_adds_and_drops_models_without_touching_the_others(smollm2_path):
    pool = Pool([_spec("a", smollm2_path), _spec("b", smollm2_path)])
    pool.update([_spec("b", smollm2_path), _spec("c", smollm2_path)])
    assert pool.known() == ["b", "c"] and [s.name for s in pool.status()] == ["b", "c"]
    with pytest.raises(UnknownModel):
        await pool.acquire("a")
    await pool.close()


async def _until(check: Callable[[], Any], wait: float = 30.0) -> bool:
    """Whether `check` (a function, or a coroutine function) comes true within `wait` seconds, asked again while
    the event loop runs the pool's tasks."""
    deadline = time.monotonic() + wait
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)


async def _stops(runner: Runner, wait: float = 15.0) -> bool:
    """The runner's process ends and is reaped, while the event loop runs the pool's stopping task."""
    return await _until(lambda: runner.pid is not None and _gone(runner.pid, wait=0.01), wait)


@pytest.mark.slow
async def test_a_model_whose_settings_changed_restarts_with_the_new_ones(smollm2_path):
    """GET /models?reload=1 after editing the presets file (Pool.update): an idle runner whose spec changed is
    stopped at once, a busy one when its request ends; the next request starts it with the new arguments."""
    pool = Pool([_spec("a", smollm2_path), _spec("b", smollm2_path)])
    try:
        old_a, old_b = await pool.acquire("a"), await pool.acquire("b")
        pool.release(old_a)  # a idle, b busy
        wider = {n: ModelSpec(n, smollm2_path, ("--model", str(smollm2_path), *RUNNER_ARGS[:-4], "--ctx", "320",
                                                *RUNNER_ARGS[-2:]), "models dir", n_ctx=320, ngl=0) for n in "ab"}
        pool.update(wider.values())
        assert await _stops(old_a) and pool.state("a") == UNLOADED
        assert old_b.alive and pool.state("b") == LOADED  # serving: it finishes its request first
        pool.release(old_b)
        assert await _stops(old_b)
        new_a = await pool.acquire("a")
        assert new_a.pid != old_a.pid and "320" in new_a.args
        pool.release(new_a)
        pool.update(wider.values())  # the same settings again: nothing restarts
        assert new_a.alive and pool.state("a") == LOADED
    finally:
        await pool.close()


def test_engine_args_carry_the_routers_engine_options():
    from localspec.backend import LoadOptions
    from localspec.engine.loader import EngineConfig
    from localspec.models import LOOKUP

    args = engine_args(EngineConfig(draft=LOOKUP, n_ctx=1024, ngl=-1, k_max=12, adaptive=False,
                                    load=LoadOptions(flash_attn=False, mmap=True, fast_path="none", type_k=8)))
    assert args == ("--ctx", "1024", "--ngl", "-1", "--lookup", "--no-adaptive", "--k-max", "12",
                    "--flash-attn", "off", "--cache-type-k", "q8_0", "--mmap", "--no-repack")


def test_the_memory_estimate_is_weights_kv_cache_and_compute_split_by_offload(smollm2_path):
    f = footprint(smollm2_path, 1024)
    assert f.kv > 0 and f.compute > 0 and f.state == 0
    assert estimate(smollm2_path, 1024, 0) == Estimate(f.total + PROCESS_BYTES, 0)
    assert estimate(smollm2_path, 1024, -1) == Estimate(PROCESS_BYTES, f.total)
    with_draft = estimate(smollm2_path, 1024, 0, draft=smollm2_path)
    assert with_draft.ram_bytes == 2 * f.total + PROCESS_BYTES


async def test_unknown_model_and_a_load_that_cannot_fit_are_refused_before_any_process(smollm2_path):
    pool = Pool([_spec("tiny", smollm2_path)], available=lambda: 50_000_000)
    with pytest.raises(UnknownModel) as e:
        await pool.acquire("nope")
    assert e.value.known == ["tiny"] and "tiny" in str(e.value)
    with pytest.raises(WontFit, match="needs about .* of memory"):
        await pool.acquire("tiny")
    assert pool.status()[0].state == UNLOADED and pool.status()[0].pid is None
    offloaded = ModelSpec("gpu", smollm2_path, ("--model", str(smollm2_path), "--ngl", "-1"), n_ctx=256, ngl=-1)
    gpu = Pool([offloaded], available=lambda: 10**12, available_vram=lambda: 50_000_000)
    with pytest.raises(WontFit, match="of GPU memory"):
        await gpu.acquire("gpu")
    assert gpu.status()[0].vram_estimate == estimate(smollm2_path, 256, -1).vram_bytes


# -- real runners -------------------------------------------------------------------------------------------------

def _key(runner: Runner) -> dict[str, str]:
    """The header only the router sends: a runner answers nothing but /health without its secret."""
    return {"Authorization": f"Bearer {runner.secret}"}


async def _complete(client: httpx.AsyncClient, runner: Runner, prompt: str, n: int = 8) -> str:
    r = await client.post(runner.url + "/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0},
                          headers=_key(runner))
    r.raise_for_status()
    return r.json()["content"]


async def _streamed_lines(client: httpx.AsyncClient, runner: Runner, prompt: str) -> list[str]:
    """Data lines of a streamed /completion until the stream breaks (it must: the runner dies)."""
    got: list[str] = []
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        async with client.stream("POST", runner.url + "/completion", headers=_key(runner),
                                 json={"prompt": prompt, "n_predict": 64, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    got.append(line)
    return got


@pytest.mark.slow
async def test_a_runner_that_crashes_mid_answer_is_named_and_restarted(smollm2_path):
    pool = Pool([_spec("tiny", smollm2_path)], env=segv.env(MARKER))
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            runner = await pool.acquire("tiny")
            assert (await client.get(runner.url + "/health")).status_code == 200
            assert await _complete(client, runner, "The sky is")  # other prompts are untouched by the hook
            first = runner.pid
            assert first is not None
            # its own process group (a terminal's Ctrl-C is the router's alone), in the router's session (a new
            # session would be a separate scheduler autogroup on Linux, slowing the router's wake-ups)
            assert os.getpgid(first) == first != os.getpgid(0) and os.getsid(first) == os.getsid(0)
            lines = await _streamed_lines(client, runner, f"Say {MARKER} and go on")
            assert lines  # the stream died mid-answer, after its first chunks
            assert await runner.died() == crash_line(signal.SIGSEGV)
            pool.release(runner)
            assert pool.status()[0].state == FAILED and pool.status()[0].failure == crash_line(signal.SIGSEGV)
            assert _gone(first)  # reaped: no zombie

            again = await pool.acquire("tiny")  # the next request starts it again
            assert again.pid != first and pool.state("tiny") == LOADED
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):  # a whole answer dies too
                await _complete(client, again, f"Say {MARKER}", n=64)
            assert await again.died() == crash_line(signal.SIGSEGV)
            pool.release(again)
            assert _gone(again.pid or 0)
    finally:
        await pool.close()


@pytest.mark.slow
async def test_models_max_evicts_the_least_recently_used_idle_model_and_keep_alive_0_unloads(smollm2_path):
    pool = Pool([_spec("a", smollm2_path), _spec("b", smollm2_path)], models_max=1, default_keep_alive=-1,
                queue_wait_s=0.1)
    try:
        ra = await pool.acquire("a")
        with pytest.raises(WontFit, match="busy .* in the load queue"):  # a serves a request: never evicted
            await pool.acquire("b")
        pool.release(ra)
        a_pid = ra.pid
        rb = await pool.acquire("b")
        states = {s.name: s.state for s in pool.status()}
        assert states == {"a": UNLOADED, "b": LOADED} and a_pid is not None and _gone(a_pid)
        assert not ra.alive and ra.failure() is None  # stopped on purpose: no failure to report
        pool.release(rb, keep_alive=0)
        assert await _until(lambda: pool.state("b") == UNLOADED) and _gone(rb.pid or 0)
    finally:
        await pool.close()


@pytest.mark.slow
async def test_an_idle_model_sleeps_and_wakes_on_the_next_request(smollm2_path):
    pool = Pool([_spec("tiny", smollm2_path)], sleep_idle_s=0.2)
    try:
        r = await pool.acquire("tiny")
        pool.release(r)
        assert pool.status()[0].expires_at is not None

        async def asleep() -> bool:
            await pool.reap()
            return pool.state("tiny") == SLEEPING

        assert await _until(asleep, wait=10) and _gone(r.pid or 0)
        woken, twin = await asyncio.gather(pool.acquire("tiny"), pool.acquire("tiny"))  # one load for both
        assert woken is twin and pool.state("tiny") == LOADED and woken.pid != r.pid
        assert pool.status()[0].busy == 2
        async with httpx.AsyncClient(timeout=120) as client:
            assert await _complete(client, woken, "Hello")
        resident = _peak_resident(woken.pid or 0)
        ram = pool.status()[0].ram_estimate or 0
        assert resident <= ram < 2 * resident  # the estimate covers what the runner used, and not wildly more
        pool.release(woken)
        pool.release(twin)
    finally:
        await pool.close()
    assert _gone(woken.pid or 0)


@pytest.mark.slow
async def test_memory_eviction_unloads_an_idle_model_for_a_pair_that_would_not_fit(smollm2_path):
    need = estimate(smollm2_path, 256, 0, draft=smollm2_path).ram_bytes
    pool: Pool

    def available() -> int:  # room for one runner: while "a" runs, the pair does not fit
        return need * 3 if "a" not in pool.loaded() else need - 1

    path = str(smollm2_path)
    pair = ModelSpec("pair", smollm2_path, ("--model", path, "--draft", path, "--ctx", "256", "--threads", "1"),
                     draft_path=smollm2_path, n_ctx=256)
    pool = Pool([_spec("a", smollm2_path), pair], available=available)
    try:
        pool.release(await pool.acquire("a"))
        rb = await pool.acquire("pair")
        assert {s.name: s.state for s in pool.status()} == {"a": UNLOADED, "pair": LOADED}
        assert pool.status()[1].ram_estimate == need
        ready = next(ln for ln in rb.lines if "localspec serve:" in ln)
        assert f"speculation {smollm2_path.name}" in ready  # the pair stays a pair in its runner
        pool.release(rb)
    finally:
        await pool.close()


@pytest.mark.slow
async def test_a_runner_that_cannot_load_fails_with_its_last_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    pool = Pool([_spec("broken", bad)])
    with pytest.raises(RunnerFailed, match="exited with code"):
        await pool.acquire("broken")
    assert pool.status()[0].state == FAILED and "broken" in (pool.status()[0].failure or "")


_ROUTER = """
import asyncio, sys
from pathlib import Path
from typing import Any, Callable
from localspec.router.discover import ModelSpec
from localspec.router.pool import Pool

async def main():
    pool = Pool([ModelSpec("tiny", Path(sys.argv[2]), tuple(sys.argv[1:]))])
    runner = await pool.acquire("tiny")
    print(runner.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_killed_router_leaves_no_runner_behind(smollm2_path):
    router = subprocess.Popen([sys.executable, "-c", _ROUTER, "--model", str(smollm2_path), *RUNNER_ARGS],
                              stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert router.stdout is not None
        line = router.stdout.readline()
        runner = int(line)
        assert not _gone(runner, wait=0.5)
        router.kill()
        router.wait(30)
        assert _gone(runner, zombie_ok=True)  # PR_SET_PDEATHSIG: the kernel killed it with its router
    finally:
        if router.poll() is None:
            router.kill()
            router.wait()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from each task's /proc children list."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for t in tasks:
        try:
            kids = [int(k) for k in (t / "children").read_text().split()]
        except FileNotFoundError:
            continue
        for k in kids:
            out += [k, *_descendants(k)]
    return out


@pytest.mark.slow
def test_a_killed_localspec_serve_router_takes_its_runners_with_it(tmp_path, smollm2_path):
    """The real command: the watcher, the router it watches, a runner the router started; SIGKILL the top."""
    from servers import ServerProcess

    from localspec.models.registry import load_registry

    (tmp_path / "models").mkdir()
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "LOCALSPEC_HOME": str(tmp_path / "home")}
    with ServerProcess(["--models-dir", str(tmp_path / "models"), *RUNNER_ARGS], env=env) as srv:
        body = {"model": load_registry().default, "prompt": "Hi", "n_predict": 2}
        assert httpx.post(srv.url + "/completion", json=body, timeout=300).status_code == 200
        assert srv.proc is not None
        below = _descendants(srv.proc.pid)
        runners = [p for p in below if b"--behind-router" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert runners and len(below) > len(runners)  # the router itself, and its runner
        srv.proc.kill()
        srv.proc.wait(30)
        assert all(_gone(p, zombie_ok=True) for p in below)
