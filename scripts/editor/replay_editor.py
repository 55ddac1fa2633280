"""Replay an editor's typing session against `localspec serve` and llama-server: the latency an editor feels.

A person types new lines into a Python file; every key sends llama.vim's `/infill` body (the local context it
builds: 256 lines above, the cursor line up to the cursor in `prompt`, 64 lines below, `n_indent`, one chunk of
another file in `input_extra`, `t_max_predict_ms` 250) and, as llama.vscode does, abandons the request still in
flight when the next key comes (the client hangs up). At a word's end the typist waits for the suggestion
(that wait is "time to suggestion"); at a line's end, once the suggestion is shown, the speculative prefetch
follows (llama.vim's next request, built as if the suggestion were accepted, `t_max_predict_ms` 1000). The same
session runs against each server in turn, A B A B, so the ratio is measured in one run.

Usage: python scripts/editor/replay_editor.py [--model FIM.gguf] [--llama-server PATH] [--rounds 2] [--where end|middle]
       [--same-tokens | --readme-layout] [--soak N]
(llama-server: built from the llama.cpp that llama-cpp-python vendors, `cmake --build build --target
llama-server`; started as llama.vim's README suggests, `--cache-reuse 256`, one slot, the same threads.)
`--soak N` instead sends N keystroke requests to localspec alone, abandoning each after a random 10-200 ms,
and prints the server's resident memory every 100 requests.

Paired replay, `--url A --vs-url B [--model-name NAME] [--n-predict 16]`, starts no server: it sends every
keystroke request of the session to two running servers that serve the same model (a single-model
`localspec serve` and a router naming it, docs/bench/router.md), one after the other, each answered in full,
streamed, greedy, with no time limit, and prints each request's time to first byte, total time and time outside
the server's own timings on both, and the paired differences B - A (median, p95): what the hop between them
costs. `--whole` sends each as llama.vim does, in one body (`stream` false): the total is what the editor waits.
`--cpu-pid PID ...` adds each process's CPU time per request (all its threads, from the kernel's schedstat),
less what it spends idle (measured for IDLE_S first): the router's own work, beside the time it adds.
"""

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import httpx

from localspec.models.gguf_header import read_header
from localspec.models.paths import cache_dir
from localspec.server.request.fim import Extra, FimTokens, build_infill

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from servers import ServerProcess, rss_mib  # noqa: E402  (the tests' helper: a real server on a free port)

IDLE_S = 3.0  # --cpu-pid: how long each process's idle CPU rate is measured before the replay
KEY_S = 0.12  # a key every 120 ms: a quick typist
WAIT_S = 10.0  # how long a paused typist waits for a suggestion
HEADER = '''"""Inventory: items, prices and stock levels."""

from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    stock: int


def total_value(items):
    """The value of everything in stock."""
    return sum(item.price * item.stock for item in items)


def low_stock(items, threshold=5):
    """Items that should be reordered."""
    return [item for item in items if item.stock < threshold]


'''
FOOTER = '''

def by_name(items):
    """Items keyed by name."""
    return {item.name: item for item in items}


def report(items):
    """One line per item: name, price, stock."""
    for item in items:
        print(f"{item.name:20} {item.price:8.2f} {item.stock:5d}")
'''.split("\n")
TYPED = [
    "def restock(items, amount):",
    "    for item in items:",
    "        item.stock += amount",
    "    return items",
    "",
    "def cheapest(items):",
    "    return min(items, key=lambda item: item.price)",
]
EXTRA = [{"filename": "pricing.py", "time": 0,
          "text": "def discount(price, rate):\n    return round(price * (1 - rate), 2)\n"}]


def in_prefix(body: dict) -> dict:
    """`--same-tokens`: the cursor line moved from `prompt` to the end of `input_prefix`. Both servers then lay
    out the same tokens (llama-server's code puts `prompt` there; localspec puts it after FIM_MID), so the model
    sees the same text and the comparison is of the servers alone."""
    return {**body, "input_prefix": body["input_prefix"] + body["prompt"], "prompt": ""}


def readme_layout(model: Path) -> Callable[[dict], dict]:
    """`--readme-layout`: llama-server gets each /infill body as a /completion whose prompt is localspec's own
    layout (the cursor line after FIM_MID, as llama-server's README has it), a mixed list: the FIM token ids
    as ids, the texts between them as strings, each tokenized on its own as localspec tokenizes them. Both
    servers then evaluate the same tokens in the layout llama.cpp's open PR moves llama-server to, with the
    same sampling fields, editor rules and prompt cache."""
    kv = read_header(model, tokens=False).kv
    fim = FimTokens.from_metadata(kv)
    assert fim is not None, f"{model} declares no FIM tokens"
    bos = kv["tokenizer.ggml.bos_token_id"] if kv.get("tokenizer.ggml.add_bos_token") else None

    def shape(body: dict) -> dict:
        p = build_infill(fim, lambda text: [text] if text else [],  # type: ignore[arg-type, return-value]
                         prefix=body["input_prefix"], suffix=body["input_suffix"], prompt=body["prompt"],
                         extra=[Extra(c["text"], c.get("filename", "tmp")) for c in body["input_extra"]],
                         bos=bos, n_ctx=4096, n_predict=body["n_predict"])
        rest = {k: v for k, v in body.items() if k not in ("input_prefix", "input_suffix", "input_extra", "prompt")}
        return {**rest, "prompt": p.tokens}
    return shape


def infill_body(lines: list[str], y: int, x: int, prev: list[str] | None = None, t_max: int = 250) -> dict:
    """llama.vim's request for the cursor at line y, column x (its s:fim_ctx_local), with `prev` the
    suggestion a prefetch assumes accepted."""
    cur = lines[y]
    below = lines[y + 1:y + 65]
    if prev:
        above = lines[max(0, y - 256):y] + ([cur + prev[0]] + prev[1:-1] if len(prev) > 1 else [])
        middle = cur + prev[0] if len(prev) == 1 else prev[-1]
        tail, indent = "", len(cur) - len(cur.lstrip())
    else:
        above = lines[max(0, y - 256):y]
        middle, tail = cur[:x], cur[x:]
        indent = 0 if not cur.strip() else len(cur) - len(cur.lstrip())
    return {"id_slot": 0, "input_prefix": "\n".join(above) + "\n", "input_suffix": tail + "\n" + "\n".join(below)
            + "\n", "input_extra": EXTRA, "prompt": middle, "n_predict": 128, "stop": [], "n_indent": indent,
            "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": t_max}


@dataclass
class Tally:
    """One session's requests against one server."""
    shape: Callable[[dict], dict] = lambda body: body  # what the session does to each request body
    route: str = "/infill"  # where it sends them
    waits: list[float] = field(default_factory=list)  # time to suggestion at a pause, seconds
    inside: list[float] = field(default_factory=list)  # of a wait, the server's own prompt_ms + predicted_ms
    outside: list[float] = field(default_factory=list)  # the rest: HTTP, parsing, tokenizing, queueing
    prefetch: list[float] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)  # prompt tokens each answered request evaluated
    cached: list[int] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)
    draft_n: int = 0
    draft_accepted: int = 0
    sent: int = 0
    abandoned: int = 0
    timeouts: int = 0  # a paused typist gave up after WAIT_S

    def answered(self, body: dict) -> None:
        t = body.get("timings", {})
        self.evaluated.append(t.get("prompt_n", 0))
        self.cached.append(body.get("tokens_cached", 0))
        self.predicted.append(t.get("predicted_n", 0))
        self.draft_n += t.get("draft_n", 0)
        self.draft_accepted += t.get("draft_n_accepted", 0)


async def ask(client: httpx.AsyncClient, body: dict, tally: Tally) -> tuple[float, dict]:
    tally.sent += 1
    t0 = time.perf_counter()
    r = await client.post(tally.route, json=tally.shape(body))
    r.raise_for_status()
    out = r.json()
    tally.answered(out)
    return time.perf_counter() - t0, out


async def session(url: str, middle: bool = False, tally: Tally | None = None) -> Tally:
    """Type TYPED under HEADER, key by key, as described in the module docstring; `middle`: with FOOTER's
    functions below the cursor (a long `input_suffix`), as when a function is added inside a file. `tally`
    says how each body is shaped and where it goes (`--same-tokens`, `--readme-layout`)."""
    tally = tally or Tally()
    lines, y = page(middle)
    async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
        await ask(client, warm_up(lines, y), tally)
        for y, x, text in keystrokes(lines, y):
            task = asyncio.create_task(ask(client, infill_body(lines, y, x), tally))
            if x == len(text) or text[x:x + 1] == " ":  # a pause: the typist waits for the suggestion
                try:
                    wait, out = await task
                except httpx.TimeoutException:
                    tally.timeouts += 1
                    continue
                tally.waits.append(wait)
                t = out.get("timings", {})
                tally.inside.append(server_time(t))
                tally.outside.append(wait - tally.inside[-1])
                if x == len(text) and out["content"]:
                    prev = out["content"].split("\n")
                    dt, _ = await ask(client, infill_body(lines, y, x, prev, t_max=1000), tally)
                    tally.prefetch.append(dt)
                continue
            await asyncio.sleep(KEY_S)
            if not task.done():
                task.cancel()
                tally.abandoned += 1
            await asyncio.gather(task, return_exceptions=True)
    return tally


def page(middle: bool) -> tuple[list[str], int]:
    """The file being edited and the line the typing starts on; `middle`: with FOOTER's functions below."""
    return HEADER.split("\n") + (FOOTER if middle else []), len(HEADER.split("\n")) - 1


def warm_up(lines: list[str], y: int) -> dict:
    """llama.vim's first request: it fills the server's cache with the file and generates nothing."""
    return {**infill_body(lines, y, 0), "n_predict": 0, "samplers": [], "t_max_prompt_ms": 1, "t_max_predict_ms": 1}


def keystrokes(lines: list[str], y: int) -> Iterator[tuple[int, int, str]]:
    """Type TYPED into `lines` from line y, one key a step: yields (y, x, the line being typed) with lines[y]
    holding its first x characters; a new line opens below each typed one."""
    for text in TYPED:
        for x in range(1, len(text) + 1):
            lines[y] = text[:x]
            yield y, x, text
        y += 1
        lines.insert(y, "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server as llama.vim's README starts it, on one slot and the given threads."""

    def __init__(self, binary: str, model: Path, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [binary, "-m", str(model), "--port", str(self.port), "-t", str(threads), "-c", "4096",
                    "-np", "1", "--cache-reuse", "256"]

    def __enter__(self) -> "LlamaServer":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        sys.exit("error: llama-server did not become healthy")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def summary(name: str, tallies: list[Tally]) -> dict:
    waits = sorted(w for t in tallies for w in t.waits)
    n_draft = sum(t.draft_n for t in tallies)
    return {"server": name, "pauses": len(waits), "median_ms": 1000 * statistics.median(waits),
            "p95_ms": 1000 * p95(waits),
            "inside_median_ms": 1000 * statistics.median([o for t in tallies for o in t.inside]),
            "outside_median_ms": 1000 * statistics.median([o for t in tallies for o in t.outside]),
            "prefetch_median_ms": 1000 * statistics.median([w for t in tallies for w in t.prefetch] or [0]),
            "sent": sum(t.sent for t in tallies), "abandoned": sum(t.abandoned for t in tallies),
            "timeouts": sum(t.timeouts for t in tallies),
            "evaluated_median": statistics.median([e for t in tallies for e in t.evaluated]),
            "cached_median": statistics.median([c for t in tallies for c in t.cached]),
            "predicted_mean": statistics.mean([p for t in tallies for p in t.predicted]),
            "draft_n": n_draft, "accepted": sum(t.draft_accepted for t in tallies)}


# -- paired: the same requests against two servers that serve the same model (a router hop's cost) ----------

# What paired replay changes in each editor body: streamed (the first byte is the first token), greedy (top_k 1:
# the editor's sampler chain has no temperature step) and with no time limit, so both servers generate the same
# tokens and a difference in time is the servers' alone
MEASURES = ("ttfb", "total", "outside")  # Timed's fields, paired and summarised
PAIRED = {"stream": True, "top_k": 1, "temperature": 0.0, "t_max_prompt_ms": 0, "t_max_predict_ms": 0}


@dataclass
class Timed:
    ttfb: float  # seconds from sending the request to the first byte of the answer's body
    total: float  # to its last byte
    text: str  # the suggestion
    inside: float | None  # the server's own prompt_ms + predicted_ms (its final event's timings), seconds

    @property
    def outside(self) -> float | None:
        """The rest of the total: HTTP, parsing, queueing, and any hop to another process."""
        return None if self.inside is None else self.total - self.inside


def timed(client: httpx.Client, body: dict) -> Timed:
    """One /infill, timed by the byte: streamed, or a whole answer (`stream` false, whose first byte comes with
    its last)."""
    t0 = time.perf_counter()
    first, data = 0.0, b""
    with client.stream("POST", "/infill", json=body) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            first = first or time.perf_counter()
            data += chunk
    end = time.perf_counter()
    return Timed((first or end) - t0, end - t0, *(answer(data) if body.get("stream") else whole_answer(data)))


def server_time(timings: dict) -> float:
    """The server's own time for a request, seconds: its prompt's evaluation and the generation."""
    return (timings.get("prompt_ms", 0) + timings.get("predicted_ms", 0)) / 1000


def whole_answer(data: bytes) -> tuple[str, float | None]:
    """A whole answer's text, and the server's own time from its `timings`."""
    out = json.loads(data)
    t = out.get("timings")
    return out.get("content", ""), server_time(t) if t else None


def answer(sse: bytes) -> tuple[str, float | None]:
    """The streamed text, and the server's own time from the event that has `timings` (the final one)."""
    text, inside = "", None
    for line in sse.split(b"\n"):
        if line.startswith(b"data: "):
            event = json.loads(line[6:])
            text += event.get("content", "")
            t = event.get("timings")
            if t:
                inside = server_time(t)
    return text, inside


def replay_paired(url: str, vs_url: str, *, rounds: int, middle: bool, model: str, n_predict: int,
                  gap_s: float = 0.05, stream: bool = True, close: bool = False) -> list[dict]:
    """Every keystroke request of the session, sent to both servers one after the other (A then B, then B then A
    for the next, so neither always goes first into a cache the other just warmed on the CPU), each answered in
    full before the next is sent, `gap_s` after the one before (a typist's keys are 120 ms apart; with none, the
    server that answered first still spins its threads and tidies up while the second starts, and on 2 cores
    whichever goes second pays for it). The warm-up is sent to each first and not timed (a router may start its
    runner then). `stream` false: each answered as the editor asks, in one body, so the total is what the
    editor waits (and the first byte comes with it). `close`: each request on a new connection (the time to
    connect is in its total)."""
    named = {"model": model} if model else {}  # llama.vim sends none; a router may need it to pick the model
    extra = {**PAIRED, "n_predict": n_predict, **named, "stream": stream}
    rows: list[dict] = []
    headers = {"connection": "close"} if close else {}
    with httpx.Client(base_url=url, timeout=120, headers=headers) as a, \
            httpx.Client(base_url=vs_url, timeout=120, headers=headers) as b:
        for r in range(rounds):
            lines, y = page(middle)
            for c in (a, b):
                timed(c, {**warm_up(lines, y), **named})
            for y, x, _ in keystrokes(lines, y):
                body = {**infill_body(lines, y, x), **extra}
                first, second = (a, b) if len(rows) % 2 == 0 else (b, a)
                t = {}
                for c in (first, second):
                    time.sleep(gap_s)
                    t[c] = timed(c, body)
                rows.append(pair_row(len(rows), t[a], t[b]))
                print(" ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    return rows


def pair_row(i: int, a: Timed, b: Timed) -> dict:
    row: dict = {"i": i, "same_text": a.text == b.text}
    for what in MEASURES:
        ta, tb = getattr(a, what), getattr(b, what)
        diff = None if ta is None or tb is None else tb - ta
        row |= {f"{what}_a_ms": _ms(ta), f"{what}_b_ms": _ms(tb), f"{what}_diff_ms": _ms(diff)}
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


def paired_summary(rows: list[dict]) -> dict:
    """Medians of each server, and the median and p95 of the paired differences (B - A). Total time only over
    the requests answered with the same text on both (the others differ by generation, not by the hop; they are
    counted). `outside` (total minus the server's own timings) leaves generation out: the hop's cost itself."""
    same = [r for r in rows if r["same_text"]]
    out: dict = {"requests": len(rows), "different_text": len(rows) - len(same)}
    for what in MEASURES:
        over = same if what == "total" else rows
        over = [r for r in over if r[f"{what}_diff_ms"] is not None]
        if not over:
            continue
        for k in ("a", "b"):
            out[f"{what}_{k}_median_ms"] = round(statistics.median(r[f"{what}_{k}_ms"] for r in over), 3)
        diffs = [r[f"{what}_diff_ms"] for r in over]
        out[f"{what}_diff_median_ms"], out[f"{what}_diff_p95_ms"] = round(statistics.median(diffs), 3), p95(diffs)
        out[f"{what}_diff_median_ci95_ms"] = median_ci95(diffs)
        for order, parity in (("a_first", 0), ("b_first", 1)):  # even rows went to A first: an order effect shows
            part = [r[f"{what}_diff_ms"] for r in over if r["i"] % 2 == parity]
            if part:
                out[f"{what}_diff_median_{order}_ms"] = round(statistics.median(part), 3)
    return out


def median_ci95(xs: list[float], resamples: int = 2000) -> list[float]:
    """A 95 % bootstrap interval of the median (seeded, so a summary is reproducible from its rows)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return [round(meds[int(0.025 * resamples)], 3), round(meds[int(0.975 * resamples) - 1], 3)]


def p95(xs: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    xs = sorted(xs)
    return xs[max(0, round(0.95 * len(xs)) - 1)]


async def soak(url: str, pid: int, n: int) -> None:
    """n keystroke requests, each abandoned after 10-200 ms unless answered; RSS every 100."""
    rng = random.Random(0)
    lines = HEADER.split("\n") + [""]
    text = "".join(t + "\n" for t in TYPED)
    tally = Tally()
    async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
        for i in range(n):
            k = i % len(text) + 1
            typed = text[:k].split("\n")
            body = infill_body(lines[:-1] + typed, len(lines) - 2 + len(typed), len(typed[-1]))
            task = asyncio.create_task(ask(client, body, tally))
            await asyncio.sleep(rng.uniform(0.01, 0.2))
            if not task.done():
                task.cancel()
                tally.abandoned += 1
            await asyncio.gather(task, return_exceptions=True)
            if i % 100 == 0 or i == n - 1:
                print(f"request {i + 1}: RSS {rss_mib(pid):.1f} MiB, abandoned {tally.abandoned}", flush=True)
        t0 = time.perf_counter()
        await client.post("/infill", json={**infill_body(lines, len(lines) - 1, 0), "n_predict": 1})
        print(f"a request after the storm answered in {1000 * (time.perf_counter() - t0):.0f} ms")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=cache_dir() / "fixtures" / "SmolLM2-135M-Instruct.fim.Q4_1.gguf")
    ap.add_argument("--llama-server", default="", help="path to llama-server (omit: localspec alone)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--soak", type=int, default=0, help="N abandoned keystroke requests, with RSS")
    ap.add_argument("--where", choices=("end", "middle"), default="end",
                    help="type at the end of the file, or between two functions (a long suffix)")
    ap.add_argument("--same-tokens", action="store_true",
                    help="the cursor line in input_prefix, so both servers evaluate the same tokens")
    ap.add_argument("--readme-layout", action="store_true",
                    help="llama-server gets localspec's layout (cursor line after FIM_MID) as a /completion")
    ap.add_argument("--url", default="", help="paired replay: a running server (A); starts no server")
    ap.add_argument("--vs-url", default="", help="paired replay: the server compared with A (B), same model")
    ap.add_argument("--model-name", default="", help="paired replay: the `model` field each request carries")
    ap.add_argument("--n-predict", type=int, default=16, help="paired replay: tokens each request generates")
    ap.add_argument("--gap-ms", type=float, default=50.0, help="paired replay: pause before each request")
    ap.add_argument("--whole", action="store_true",
                    help="paired replay: whole answers (`stream` false, as llama.vim asks), not streamed")
    ap.add_argument("--new-connections", action="store_true",
                    help="paired replay: each request on a new connection (`Connection: close`), as llama.vim's "
                         "curl sends them; by default one keep-alive connection per server, as most editors keep")
    ap.add_argument("--cpu-pid", type=int, nargs="+", default=[],
                    help="paired replay: report these processes' CPU time per request (e.g. the router's)")
    ap.add_argument("--json", type=Path)
    return ap


def main() -> int:
    args = parser().parse_args()
    if args.url or args.vs_url:
        if not (args.url and args.vs_url):
            sys.exit("error: paired replay needs both --url and --vs-url")
        return paired(args)
    ours = ServerProcess(["--model", str(args.model), "--ctx", "4096", "--threads", str(args.threads)])
    with ours:
        if args.soak:
            assert ours.proc is not None
            asyncio.run(soak(ours.url, ours.proc.pid, args.soak))
            return 0
        servers = {"localspec": ours.url}
        theirs = LlamaServer(args.llama_server, args.model, args.threads) if args.llama_server else None
        with theirs or _Nothing():
            if theirs:
                servers["llama-server"] = theirs.url
            tallies: dict[str, list[Tally]] = {name: [] for name in servers}

            def tally(name: str) -> Tally:
                if args.same_tokens:
                    return Tally(shape=in_prefix)
                if args.readme_layout and name == "llama-server":
                    return Tally(shape=readme_layout(args.model), route="/completion")
                return Tally()

            for r in range(args.rounds):
                for name, url in servers.items():
                    tallies[name].append(asyncio.run(session(url, args.where == "middle", tally(name))))
                    print(f"round {r + 1} {name}: done", file=sys.stderr, flush=True)
    rows = [summary(name, t) for name, t in tallies.items()]
    print(json.dumps(rows, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def paired(args: argparse.Namespace) -> int:
    """`--url A --vs-url B`: a line per request as it is answered, then the summary as JSON (`--json`: the
    summary and every request)."""
    idle = {pid: cpu_rate(pid, IDLE_S) for pid in args.cpu_pid}
    before, t0 = {pid: cpu_s(pid) for pid in args.cpu_pid}, time.perf_counter()
    rows = replay_paired(args.url, args.vs_url, rounds=args.rounds, middle=args.where == "middle",
                         model=args.model_name, n_predict=args.n_predict, gap_s=args.gap_ms / 1000,
                         stream=not args.whole, close=args.new_connections)
    wall = time.perf_counter() - t0
    out = paired_summary(rows)
    for pid in args.cpu_pid:
        used = cpu_s(pid) - before[pid]
        out[f"cpu_us_per_request_pid_{pid}"] = round(1e6 * used / len(rows), 1)
        out[f"cpu_us_per_request_less_idle_pid_{pid}"] = round(1e6 * (used - idle[pid] * wall) / len(rows), 1)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"url": args.url, "vs_url": args.vs_url, "summary": out, "requests": rows},
                                        indent=1))
    return 0


def cpu_s(pid: int) -> float:
    """Seconds of CPU a process's threads have run (the first field of each thread's schedstat, in ns)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total / 1e9


def cpu_rate(pid: int, seconds: float) -> float:
    """A process's CPU seconds per second while nothing is asked of it (timers, health checks)."""
    start = cpu_s(pid)
    time.sleep(seconds)
    return (cpu_s(pid) - start) / seconds


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
