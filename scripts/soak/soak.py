"""A soak of `localspec serve`: thousands of short requests in every protocol, with runners killed, unloaded and
put to sleep among them, then a check that nothing was lost or leaked (docs/bench/soak.md).

Router mode (the default) serves smollm2-135m and gemma3-270m, each in its own runner. Requests mix OpenAI
(/v1/chat/completions, /v1/completions), llama.cpp (/completion, /infill), Ollama (/api/chat, /api/generate),
Anthropic (/v1/messages) and /v1/responses, whole and streamed, 2-8 tokens each, at concurrency 1 to 4; 4 %
of them leave mid-stream and 2 % mid-answer. Every --crash-every requests a runner dies of SIGSEGV mid-answer
(in turn from the tests' fault hook, tests/faults/segv.py, and from `kill -SEGV` once its stream began); every
--unload-every requests a keep_alive 0 unloads one; every --sleep-every requests the soak waits until both
models sleep (--sleep-idle-seconds). Single-model mode (`--mode single`) serves smollm2-135m alone: no crash
(nothing restarts that server's process) and no sleep (router mode only); keep_alive 0 is just answered.

Every request must end in its answer, its protocol's refusal where the probe at the start saw one, the
protocol's error naming the SIGSEGV when the soak killed its runner, or the hang-up the soak chose; anything
else is a failure. Before each event and at the end, with nothing in flight, each runner's
localspec_requests_total must equal what it was sent (soak_ledger.py). The server's processes are sampled at
the start, the middle and the end (descriptors, threads, RSS); after the server stops, none of its processes
may be left and its port must be free.

Usage: python scripts/soak/soak.py [--mode router|single] [--requests 5000] [--max-seconds 2400] [--out FILE.json]
Loopback only: the server listens on 127.0.0.1 on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from faults import segv  # noqa: E402  (the tests' fault hook: a runner dies of SIGSEGV on a marked prompt)
from servers import ServerProcess  # noqa: E402  (the tests' helper: a real `localspec serve` on a free port)
from soak_procs import left_over, loadavg, port_free  # noqa: E402
from soak_report import markdown  # noqa: E402
from soak_run import MARKER, Soak  # noqa: E402

MODELS = {"router": ["smollm2-135m", "gemma3-270m"], "single": ["smollm2-135m"]}
STOP_S = 30.0  # how long a stopped server may take to end before it counts as hung


def server_args(mode: str, sleep_idle_s: float) -> list[str]:
    if mode == "router":
        return ["--router", "--sleep-idle-seconds", str(sleep_idle_s)]
    return ["--model", "smollm2-135m", "--alias", "smollm2-135m"]


async def drive(soak: Soak, a: argparse.Namespace, t_end: float) -> dict:
    """The rounds and the events between them; returns what the schedule did."""
    await asyncio.gather(*(soak.wake(m) for m in soak.models))
    soak.wakes.clear()  # the first loads (a model assembled, a calibration measured) are not restarts
    await soak.probe()
    await soak.check()
    await soak.take_samples("start")
    n_rounds = -(-a.requests // a.round)
    rounds = crashes = unloads = 0
    for i in range(1, n_rounds + 1):
        if time.monotonic() > t_end:
            break
        await soak.traffic(a.round, 1 + i % 4)
        await soak.check()  # after every round: the counters, and the server's own descriptors and memory
        rounds += 1
        done = i * a.round
        if i == n_rounds // 2:
            await soak.take_samples("middle")
        if a.mode == "router" and done % a.crash_every < a.round:
            await soak.crash(soak.models[crashes % len(soak.models)], external=crashes % 4 in (1, 2))
            crashes += 1
        if done % a.unload_every < a.round:
            await soak.unload(soak.models[unloads % len(soak.models)], with_prompt=unloads % 3 != 2)
            unloads += 1
        if a.mode == "router" and done % a.sleep_every < a.round:
            await soak.sleep(a.sleep_idle)
        await soak.unscheduled()
    await soak.check()
    await soak.take_samples("end")
    return {"rounds": rounds, "rounds_planned": n_rounds, "stopped_early": rounds < n_rounds}


def stop(srv: ServerProcess, soak: Soak, port: int) -> dict:
    """SIGTERM to `localspec serve`; then what is left of its processes, and whether its ports are free."""
    t0 = time.monotonic()
    srv.proc.terminate()
    try:
        code = srv.proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t0
    srv.stop()
    time.sleep(0.5)
    return {"exit_code": code, "stop_s": round(took, 2), "processes_seen": len(soak.pids),
            "left_over": left_over(soak.pids), "port_free": port_free(port),
            "runner_ports_busy": [p for p in sorted(soak.ports) if not port_free(p)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["router", "single"], default="router")
    ap.add_argument("--requests", type=int, default=5000, help="requests of the mix (events come on top)")
    ap.add_argument("--round", type=int, default=50, help="requests between readings")
    ap.add_argument("--crash-every", type=int, default=250)
    ap.add_argument("--unload-every", type=int, default=400)
    ap.add_argument("--sleep-every", type=int, default=1000)
    ap.add_argument("--sleep-idle", type=float, default=15.0, help="the router's --sleep-idle-seconds (longer "
                    "than an event takes, or the model an event leaves alone sleeps meanwhile)")
    ap.add_argument("--max-seconds", type=float, default=2400, help="no new round after this long")
    ap.add_argument("--seed", type=int, default=53)
    ap.add_argument("--out", type=Path, help="write every number as JSON here")
    a = ap.parse_args()
    env = segv.env(MARKER) if a.mode == "router" else {}
    t0 = time.monotonic()
    load_before = loadavg()
    tree = {"head": _git("rev-parse", "HEAD").strip(), "uncommitted": _git("diff", "--stat").splitlines()[-1:]}
    with ServerProcess(server_args(a.mode, a.sleep_idle), env=env, timeout=900) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        soak = Soak(srv, router=a.mode == "router", models=MODELS[a.mode], seed=a.seed)
        schedule = asyncio.run(run(soak, a, t0 + a.max_seconds))
        shutdown = stop(srv, soak, port)
    result = {"mode": a.mode, "args": vars(a) | {"out": str(a.out)}, "seconds": round(time.monotonic() - t0),
              "loadavg_before": load_before, "loadavg_after": loadavg(), "schedule": schedule,
              "sent": soak.sent, "outcomes": dict(soak.outcomes), "failures": soak.failures,
              "by_protocol": [[*k, n] for k, n in sorted(soak.by_protocol.items())],
              "expect": {f"{m} {p}": v for (m, p), v in soak.expect.items()}, "events": dict(soak.events),
              "counters": soak.ledger.totals(), "router_answered": dict(soak.ledger.router_answered),
              "samples": soak.samples, "series": soak.series, "wakes_s": [round(w, 2) for w in soak.wakes],
              "examples": soak.examples, "shutdown": shutdown, "server_log": srv.log,
              "tree": tree}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    sys.exit(1 if soak.failures or shutdown["left_over"] or not shutdown["port_free"] else 0)


def _git(*args: str) -> str:
    """The checkout the soak ran against: other work in the tree may not be committed yet."""
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE.parents[1]).stdout


async def run(soak: Soak, a: argparse.Namespace, t_end: float) -> dict:
    try:
        return await drive(soak, a, t_end)
    except Exception as e:  # the soak's own fault, or a server that stopped answering: reported, not lost
        soak.failures.append(f"the soak stopped: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return {"aborted": repr(e)}
    finally:
        await soak.client.aclose()


if __name__ == "__main__":
    main()
