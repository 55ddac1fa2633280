"""The soak's run against one started server (scripts/soak/soak.py): rounds of mixed requests at concurrency 1-4,
and between rounds the events that end a runner (a SIGSEGV from the fault hook or from outside, keep_alive 0,
an idle sleep), each preceded by a reading of every runner's counters while nothing is in flight.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import httpx
from soak_ledger import Ledger, parse_metrics
from soak_procs import children, descendants, loadavg, sample, state, zombies
from soak_traffic import PROTOCOLS, Outcome, Req, send

MARKER = "ZQXCRASHZQX"  # a prompt holding it makes its runner die of SIGSEGV after two chunks (tests/faults/segv.py)
WORDS = ("French", "Spanish", "German", "Italian", "Dutch", "Polish", "Greek", "Latin")
GONE_S = 10.0  # how long a stopped runner may take to end
LONG = 128  # tokens asked by a request the client leaves, or the soak kills: long enough to be under way


class Soak:
    """Requests, events and readings against the server `srv` (tests/servers.py's ServerProcess)."""

    def __init__(self, srv: Any, *, router: bool, models: list[str], seed: int) -> None:
        self.srv, self.router, self.models = srv, router, models
        self.rng = random.Random(seed)
        self.ledger = Ledger(models)
        self.outcomes: Counter = Counter()
        self.by_protocol: Counter = Counter()  # (protocol, streamed, kind)
        self.failures: list[str] = []
        self.examples: dict[str, str] = {}  # the first message of each refusal and crash, by model and protocol
        self.expect: dict[tuple[str, str], str] = {}  # (model, protocol) -> answered | refused
        self.events: Counter = Counter()
        self.samples: dict[str, dict[str, Any]] = {}
        self.series: list[dict[str, Any]] = []  # the router's (or server's) numbers at every reading
        self.pids: set[int] = set()
        self.ports: set[int] = set()
        self.wakes: list[float] = []  # seconds of the first answer from a new runner (its start included)
        self.sent = 0
        self.log_at = 0  # the server's log lines read by `unscheduled`
        self.client = httpx.AsyncClient(base_url=srv.url, timeout=None,
                                        limits=httpx.Limits(max_connections=16, max_keepalive_connections=8))

    # -- one request ---------------------------------------------------------------------------------------------

    async def go(self, r: Req, expect: set[str], book: str = "gen") -> Outcome:
        """Send `r`, count its outcome, book it (`gen`: to the model's runner; `last`: it ends that runner;
        `router`: the router answers it; `none`: the caller books it)."""
        self.sent += 1
        out = await send(self.client, r)
        self.outcomes[out.kind] += 1
        if out.kind in ("refused", "crashed", "failed"):
            self.examples.setdefault(f"{r.model} {r.protocol} stream={r.stream} {out.kind}", out.detail)
        self.by_protocol[(r.protocol, r.stream, out.kind)] += 1
        if out.kind not in expect:
            self.failures.append(f"{r.protocol} {r.model} stream={r.stream} hang_up={r.hang_up}: wanted "
                                 f"{sorted(expect)}, got {out.kind} ({out.status} {out.detail})")
        if book == "gen":
            self.ledger.book(r.model, r.route)
        elif book == "last":
            self.ledger.book_last(r.model, r.route)
        elif book == "router":
            self.ledger.router_answered[r.route] += 1
        return out

    def plain(self, model: str, protocol: str | None = None, **kw: Any) -> Req:
        protocol = protocol or self.rng.choice(PROTOCOLS)
        prompt = f"Say hello in {self.rng.choice(WORDS)}, number {self.sent}."
        kw.setdefault("stream", self.rng.random() < 0.5)
        return Req(protocol, model, prompt, kw.pop("n", self.rng.randint(2, 8)), **kw)

    def answering(self, model: str) -> str:
        """A protocol that model answers (not one it refuses, as /infill without FIM tokens); /completion
        before the probe."""
        return self.rng.choice([p for p in PROTOCOLS if self.expect.get((model, p)) == "answered"] or ["completion"])

    # -- traffic -------------------------------------------------------------------------------------------------

    def traffic_req(self) -> tuple[Req, set[str]]:
        """A request of the mix: any protocol, model, streamed or not; 4 % leave mid-stream, 2 % mid-answer."""
        r = self.plain(self.rng.choice(self.models))
        base = {self.expect[(r.model, r.protocol)]}
        u = self.rng.random()
        if u < 0.04:
            r.stream, r.hang_up, r.n = True, "stream", LONG
            return r, base | {"hung_up"}
        if u < 0.06:
            r.stream, r.hang_up, r.n, r.hang_up_s = False, "whole", LONG, self.rng.uniform(0.2, 0.6)
            return r, base | {"hung_up"}
        return r, base

    async def traffic(self, n: int, concurrency: int) -> None:
        queue = [self.traffic_req() for _ in range(n)]

        async def worker() -> None:
            while queue:
                r, expect = queue.pop()
                await self.go(r, expect)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def probe(self) -> None:
        """Each model once in each protocol, whole and streamed: what it answers and what it refuses (a model
        without FIM tokens refuses /infill) is what the soak expects of it from then on."""
        for model in self.models:
            for protocol in PROTOCOLS:
                kinds = {(await self.go(self.plain(model, protocol, stream=s), {"answered", "refused"})).kind
                         for s in (False, True)}
                self.expect[(model, protocol)] = "answered" if kinds == {"answered"} else "refused"

    # -- readings ------------------------------------------------------------------------------------------------

    async def status(self) -> dict[str, tuple[str, int | None]]:
        """Each model's state and runner pid (a single-model server: its own serving process)."""
        if not self.router:
            return {m: ("loaded", self.server_pid()) for m in self.models}
        data = (await self.client.get("/models")).json()["data"]
        out: dict[str, tuple[str, int | None]] = {m: ("not listed", None) for m in self.models}
        for m in data:
            if m["id"] in self.models:
                st = m["status"]
                out[m["id"]] = (st["value"], st.get("pid"))
                if st.get("pid"):
                    self.pids.add(st["pid"])
                    self.ports.add(st["port"])
        return out

    def server_pid(self) -> int:
        """The router's (or single-model server's) process: the child of the watching `localspec serve`."""
        kids = children(self.srv.proc.pid)
        return kids[0] if kids else self.srv.proc.pid

    async def check(self) -> None:
        """With nothing in flight: every loaded runner's request counters against what it was sent."""
        for model, (st, pid) in (await self.status()).items():
            if st != "loaded" or pid is None:
                continue
            params = {"model": model} if self.router else None
            counts = parse_metrics((await self.client.get("/metrics", params=params)).text)
            problem = self.ledger.check(model, pid, counts)
            if problem:
                self.failures.append(f"counters: {problem}")
        s = sample("server", self.server_pid())
        if s is not None:
            self.series.append({"sent": self.sent, "fds": s.fds, "threads": s.threads, "rss_mib": s.rss_mib})

    async def take_samples(self, label: str) -> None:
        """Descriptors, threads and memory of every process of the server now, its zombies and the load."""
        status = await self.status()
        runners = {pid: m for m, (st, pid) in status.items() if pid}
        sup, server = self.srv.proc.pid, self.server_pid()
        self.pids |= {sup, server}
        rows = [sample("supervisor", sup), sample("router" if self.router else "server", server)]
        if self.router:
            for pid in children(server):
                gen = self.ledger.current(runners[pid]).number if pid in runners else 0
                rows.append(sample(f"{runners.get(pid, '?')} (gen {gen})", pid))
        self.samples[label] = {"sent": self.sent, "at": time.strftime("%H:%M:%S", time.gmtime()),
                               "processes": [r.row() for r in rows if r is not None],
                               "zombies": zombies(descendants(sup)), "loadavg": loadavg()}

    # -- events that end a runner -----------------------------------------------------------------------------------

    async def wake(self, model: str) -> None:
        """The model's next request after its runner ended: it starts a new runner, and waits for it."""
        t0 = time.monotonic()
        await self.go(self.plain(model, self.answering(model)), {"answered"})
        self.wakes.append(time.monotonic() - t0)

    async def crash(self, model: str, external: bool) -> None:
        """The model's runner dies of SIGSEGV mid-answer: from the fault hook (a prompt with the marker), or sent
        by the soak once the first event of a stream arrived. With the hook, a second request for the same model
        (queued behind the first, or arriving after the death) and one for the other model go alongside."""
        await self.check()
        self.events["crash (kill -SEGV)" if external else "crash (fault hook)"] += 1
        protocol = self.answering(model)
        if external:
            pid = (await self.status())[model][1]
            assert pid is not None
            r = self.plain(model, protocol, stream=True, n=LONG, on_first=lambda: os.kill(pid, signal.SIGSEGV))
            out = await self.go(r, {"crashed", "answered"}, book="last")  # answered: ended with its 1st event
            self.ledger.end(model)
            await self.gone(pid, f"kill -SEGV after the first event of a {r.route} stream that was {out.kind}: "
                                 f"{model}'s runner")
        else:
            r = Req(protocol, model, f"Repeat after me: {MARKER} {MARKER}", 64, self.rng.random() < 0.5)
            task = asyncio.ensure_future(self.go(r, {"crashed"}, book="none"))
            await asyncio.sleep(0.15)
            same = self.plain(model, self.answering(model))
            others = [self.plain(m, self.answering(m)) for m in self.models if m != model]
            outs = await asyncio.gather(self.go(same, {"crashed", "answered"}, book="none"),
                                        *(self.go(o, {"answered"}) for o in others))
            await task
            self.ledger.book_last(model, r.route)
            self.ledger.end(model)
            if outs[0].kind == "answered":  # by the runner started after the crash
                self.ledger.book(model, same.route)
            else:
                self.ledger.lost[model] += 1
        await self.wake(model)

    async def unload(self, model: str, with_prompt: bool) -> None:
        """keep_alive 0: an Ollama answer after which the runner stops, or Ollama's unload request (no prompt),
        which the router answers itself. A single-model server answers and keeps its model."""
        await self.check()
        self.events[f"keep_alive 0 ({'answer' if with_prompt else 'unload request'})"] += 1
        old = (await self.status())[model][1]
        if with_prompt or not self.router:
            ollama = [p for p in ("ollama_generate", "ollama_chat") if self.expect[(model, p)] == "answered"]
            r = self.plain(model, self.rng.choice(ollama), keep_alive=0)
            await self.go(r, {"answered"}, book="last" if self.router else "gen")
        else:
            r = Req("ollama_generate", model, "", 0, False, keep_alive=0)
            await self.go(r, {"answered"}, book="router")
        if not self.router:
            return
        self.ledger.end(model)
        await self.until(model, {"unloaded"}, 60)
        await self.gone(old, f"keep_alive 0: {model}'s runner")
        await self.wake(model)

    async def sleep(self, idle_s: float) -> None:
        """No request for longer than --sleep-idle-seconds: every model goes to sleep, its runner gone."""
        await self.check()
        self.events["idle sleep (all models)"] += 1
        old = await self.status()
        for model in self.models:
            await self.until(model, {"sleeping"}, idle_s + 60)
            self.ledger.end(model)
        for model, (_, pid) in old.items():
            await self.gone(pid, f"sleep: {model}'s runner")
        self.log_at = len(self.srv.log)
        await asyncio.gather(*(self.wake(m) for m in self.models))

    async def unscheduled(self) -> None:
        """After an event: a model the event did not touch may have slept meanwhile (it was idle for longer than
        --sleep-idle-seconds), or been evicted; the router's log says so. Its runner's generation ends there,
        and it is woken before the traffic goes on."""
        lines, self.log_at = self.srv.log[self.log_at:], len(self.srv.log)
        for model in self.models:
            if any(ln.startswith(f"router: stopping {model} (") and ("(idle" in ln or "(evicted" in ln)
                   for ln in lines):
                self.events["idle sleep or eviction during another event"] += 1
                self.ledger.end(model)
                await self.wake(model)

    async def gone(self, pid: int | None, what: str) -> None:
        """The process `pid` ends within GONE_S (the router marks a model unloaded, then stops its runner:
        SIGTERM, and SIGKILL after 5 s) and leaves no zombie."""
        deadline = time.monotonic() + GONE_S
        while pid is not None and state(pid) is not None:
            if time.monotonic() > deadline:
                self.failures.append(f"{what} {pid} still exists ({state(pid)}) {GONE_S:.0f} s later")
                return
            await asyncio.sleep(0.1)

    async def until(self, model: str, states: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (st := (await self.status())[model][0]) not in states:
            if time.monotonic() > deadline:
                self.failures.append(f"{model} stayed {st}, wanted {sorted(states)} within {timeout:.0f} s")
                return
            await asyncio.sleep(0.25)
