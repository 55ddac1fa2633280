"""Plain vs speculative decoding with the target on llama.cpp's RPC backend, local and over loopback RPC.

For each placement (local; RPC on loopback; RPC behind a proxy that adds D ms each way) and each config (plain,
prompt lookup, a model drafter kept local) it runs `localspec run --json` on the bench's built-in prompts and
prints one Markdown table: tok/s, speedup over plain in the same placement, acceptance α, tokens per verify pass,
the calibrated v(γ) the adaptive controller used (measured on the loaded model, so over RPC it includes the
network), and the target's ms per plain token. Every run is a fresh process (a fresh model load and calibration).

    python scripts/bench/bench_rpc.py --rpc-server /path/to/ggml-rpc-server --draft smollm2-135m \\
        --model ~/.cache/localspec/fixtures/SmolLM2-135M-Instruct.F16.gguf --delay-ms 0,1,5 --markdown rpc.md

The delay proxy models network latency without a bandwidth limit (every chunk is delivered D ms after it
arrived, in each direction), like `tc qdisc add dev lo root netem delay Dms` without needing root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from localspec.bench.tasks import builtin_prompts, select
from localspec.errors import ModelLoadError
from localspec.models.rpc import Endpoint, probe


class DelayProxy:
    """127.0.0.1:port -> target, each chunk delivered `delay_s` after it arrived, in both directions."""

    def __init__(self, target: Endpoint, delay_s: float) -> None:
        self.target, self.delay_s = target, delay_s
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(self.target.host, self.target.port)
        await asyncio.gather(self._pipe(cr, sw), self._pipe(sr, cw), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get())[1]:
                await asyncio.sleep(max(0.0, item[0] - self.loop.time()))
                writer.write(item[1])
                await writer.drain()
            writer.close()

        task = asyncio.create_task(deliver())
        while data := await reader.read(1 << 16):
            queue.put_nowait((self.loop.time() + self.delay_s, data))
        queue.put_nowait((0.0, b""))
        await task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rpc_server(binary: str, threads: int | None, cpus: str | None) -> tuple[subprocess.Popen, Endpoint]:
    ep = Endpoint("127.0.0.1", free_port())
    cmd = [binary, "-H", ep.host, "-p", str(ep.port)] + (["-t", str(threads)] if threads else [])
    cmd = ["taskset", "-c", cpus, *cmd] if cpus else cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            probe(ep, 1.0)
            return proc, ep
        except ModelLoadError:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"{binary} did not start on {ep}")


def run_one(args: argparse.Namespace, config: list[str], where: list[str], prompt) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(prompt.prompt)
        f.flush()
        cmd = [sys.executable, "-m", "localspec", "run", "--json", "-n", str(args.max_tokens), "--ctx", "2048",
               "--prompt-file", f.name, *(["--chat"] if prompt.chat else []), *config, *where,
               *(["--model", args.model] if args.model else []), *(["--threads", str(args.threads)]
                                                                    if args.threads else [])]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def summarize(runs: list[dict]) -> dict:
    tokens = sum(r["stats"]["n_generated"] for r in runs)
    gen_s = sum(r["stats"]["gen_ms"] for r in runs) / 1e3
    drafted = sum(r["draft_n"] for r in runs)
    accepted = sum(r["draft_n_accepted"] for r in runs)
    rounds = sum(r["stats"]["rounds"] for r in runs)
    return {"tok_s": tokens / gen_s if gen_s else 0.0, "alpha": accepted / drafted if drafted else None,
            "per_pass": 1 + accepted / rounds if rounds else None, "v": runs[0].get("v") or []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rpc-server", required=True, help="path to llama.cpp's ggml-rpc-server")
    ap.add_argument("--model", help="target (default: localspec's default model)")
    ap.add_argument("--draft", help="model drafter (same tokenizer); omitted: plain and lookup only")
    ap.add_argument("--delay-ms", default="0", help="added one-way latency per RPC placement, e.g. 0,1,5")
    ap.add_argument("--tasks", default="edit,code,chat", help="built-in bench tasks")
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, help="localspec's threads (and the rpc server's)")
    ap.add_argument("--server-cpus", help="pin the rpc server to these CPUs (taskset -c), e.g. 1: on one small "
                    "machine client and server otherwise compete for the same cores")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()

    prompts = select(builtin_prompts(), args.tasks.split(","), args.per_task)
    configs = {"plain": ["--no-spec"], "lookup": ["--lookup"]}
    if args.draft:
        configs[f"draft {Path(args.draft).name}"] = ["--draft", args.draft]
    proc, ep = start_rpc_server(args.rpc_server, args.threads, args.server_cpus)
    proxies: list[DelayProxy] = []
    try:
        places: dict[str, list[str]] = {"local": []}
        for d in (float(x) for x in args.delay_ms.split(",")):
            if d == 0:
                places["rpc loopback"] = ["--rpc", str(ep), "--ngl", "-1"]
            else:
                proxies.append(DelayProxy(ep, d / 1e3))
                places[f"rpc +{d:g} ms"] = ["--rpc", f"127.0.0.1:{proxies[-1].port}", "--ngl", "-1"]
        rows = []
        for place, where in places.items():
            plain_tok_s = None
            for name, config in configs.items():
                s = summarize([run_one(args, config, where, p) for p in prompts])
                plain_tok_s = plain_tok_s or s["tok_s"]
                rows.append((place, name, s, s["tok_s"] / plain_tok_s, 1e3 / plain_tok_s))
                print(f"{place:>14} {name:>20}: {s['tok_s']:.1f} tok/s", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    table = ["| placement | config | tok/s | × plain | α | tok/pass | target ms/tok | v(1..4) |",
             "|---|---|---|---|---|---|---|---|"]
    for place, name, s, speedup, ms in rows:
        alpha = f"{s['alpha']:.2f}" if s["alpha"] is not None else "-"
        per_pass = f"{s['per_pass']:.2f}" if s["per_pass"] is not None and name != "plain" else "-"
        v = " ".join(f"{x:.2f}" for x in s["v"][1:5]) or "-"
        table.append(f"| {place} | {name} | {s['tok_s']:.1f} | {speedup:.2f} | {alpha} | {per_pass} | {ms:.2f} | {v} |")
    text = "\n".join(table)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
