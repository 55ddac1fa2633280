"""Run the real Claude Code (`claude -p`) and Codex CLI (`codex exec`) against `localspec serve` and report each
request's status.

    python scripts/clients/real_clients.py --model gemma3-270m --ctx 32768 \
        --serve-arg=--chat-template-file=tests/templates/gemma-3.jinja --timeout 900

The clients come from npm (`npm install -g @anthropic-ai/claude-code @openai/codex`, or `--bin DIR` for a
folder with `claude` and `codex`). Each runs in a fresh temporary HOME (no user settings, no network beyond
this machine) in a folder with two files to list, through a logging proxy in front of the server: every request
is printed with its method, path, status, size and time, and a failed one with the error it got. The server
starts once, with `--ctx` large enough for Claude Code's first prompt (~21k tokens) if the model has it; a
2-core CPU takes many minutes over that prompt, where `--claude-arg=--tools=Bash` leaves ~2k tokens:

    python scripts/clients/real_clients.py --model smollm2-135m --ctx 8192 --claude-arg=--tools=Bash

`--codex-lean` and `--claude-lean` cut both clients' prompts to ~1k tokens, with one call-then-answer example
for a tiny model; docs/server.md ("Real clients") has the last run's command and results.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

READY = re.compile(r"localspec serve: (http://\S+)")
PROMPT = "List the files in the current directory with a tool, then say how many there are."
CODEX_CONFIG = """model = "{model}"
model_provider = "localspec"

[model_providers.localspec]
name = "localspec"
base_url = "{url}/v1"
wire_api = "responses"
stream_idle_timeout_ms = 3600000
request_max_retries = 0
stream_max_retries = 0
"""
# Codex's built-in prompt is ~41 KB (~10k tokens): 17 KB of instructions, a 11 KB multi-agent namespace, goal,
# image, skill, question and web-search tools. `--codex-lean` drops those for a ~4 KB prompt that a 2-core CPU reads in
# a minute; the shell tool (exec_command) stays.
CODEX_LEAN = """model_instructions_file = "{instructions}"
web_search = "disabled"
include_permissions_instructions = false
include_environment_context = false
agents.enabled = false
features.goals = false
features.view_image = false
features.apps = false
features.plugins = false
skills.bundled.enabled = false
tools.experimental_request_user_input.enabled = false
"""
# A tiny model copies what it sees: one call, then an answer, shown in the JSON a template without tool syntax
# gets (engine/toolgrammar.py). Without the example Gemma-3-270M mostly answered at once or called tools forever.
LEAN_INSTRUCTIONS = """You are a coding agent in a terminal. Run one shell command with the {tool} tool, then \
answer the user from its output in one sentence, without another tool. For example:

user: How many files are there?
you: {{"tool_calls": [{{"name": "{tool}", "arguments": {{"{arg}": "ls"}}}}]}}
user: {{"tool_response": {{"tool": "{tool}", "content": "a.txt\\nb.txt"}}}}
you: {{"response": "There are 2 files: a.txt and b.txt."}}
"""


@dataclass
class Hit:
    client: str
    method: str
    path: str
    status: int
    size: int
    seconds: float
    error: str
    asked: str = ""
    tokens: str = ""

    def row(self) -> str:
        error = self.error.replace("|", "/").replace(chr(10), " ")[:160]
        return (f"| {self.client} | {self.method} {self.path} | {self.asked} | {self.status} | {self.tokens} | "
                f"{self.size} | {self.seconds:.1f} | {error} |")


def prompt_tokens(tail: bytes) -> str:
    """The prompt's size and its part read from the prompt cache, from the usage at the end of an answer."""
    text = tail.decode("utf-8", "replace")
    total = re.findall(r'"(?:input|prompt)_tokens":\s*(\d+)', text)
    cached = re.findall(r'"(?:cached_tokens|cache_read_input_tokens)":\s*(\d+)', text)
    return f"{total[-1]} ({cached[-1] if cached else 0} cached)" if total else ""


def asked(body: bytes) -> str:
    """What a request asked for, in a few words: the kinds of its last input items and how many tools it had."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    items = data.get("input") if isinstance(data.get("input"), list) else data.get("messages") or []
    kinds = [str(i.get("type") or i.get("role")) for i in items[-3:] if isinstance(i, dict)]
    return f"{len(body) // 1024} KB, {len(data.get('tools') or [])} tools, last items: {' '.join(kinds)}"


class Proxy(http.server.ThreadingHTTPServer):
    """Forwards every request to `upstream` and streams the answer back, recording each one."""

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = urlsplit(upstream)
        self.hits: list[Hit] = []
        self.client = ""
        self.save: Path | None = None  # a folder for every request's body, for captures
        self.temperature: float | None = None  # set on requests that name none (Codex has no setting for it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client dropping a kept-alive
            super().handle_error(request, client_address)                     # connection is no news


def with_temperature(body: bytes, temperature: float | None) -> bytes:
    """The body with `temperature` set when it is a JSON object that names none."""
    if temperature is None or not body:
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict) or "temperature" in data:
        return body
    return json.dumps({**data, "temperature": temperature}).encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Proxy

    def _forward(self) -> None:
        t0 = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.save and body:
            n = len(list(self.server.save.glob("*.json")))
            (self.server.save / f"{n:03d}-{self.server.client}.json").write_bytes(body)
        up = http.client.HTTPConnection(self.server.upstream.hostname or "127.0.0.1", self.server.upstream.port,
                                        timeout=3600)
        body = with_temperature(body, self.server.temperature)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        if body:
            headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}
            headers["Content-Length"] = str(len(body))
        try:
            up.request(self.command, self.path, body or None, headers)
            r = up.getresponse()
        except OSError as e:  # the server is gone: what this script is here to catch
            self.server.hits.append(Hit(self.server.client, self.command, self.path, 0, 0,
                                        time.monotonic() - t0, f"no answer: {e}"))
            self.send_error(502)
            return
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        size, head, tail = 0, b"", b""
        while chunk := r.read1(65536) if hasattr(r, "read1") else r.read(65536):
            size += len(chunk)
            head = (head + chunk)[-2000:] if r.status >= 400 or b"event: error" in chunk else head
            tail = (tail + chunk)[-8000:]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        error = head.decode("utf-8", "replace").strip()[-300:] if head else ""
        hit = Hit(self.server.client, self.command, self.path, r.status, size, time.monotonic() - t0, error,
                  asked(body), prompt_tokens(tail))
        self.server.hits.append(hit)
        print(hit.row(), flush=True)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

    def log_message(self, *args: object) -> None:
        pass


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "localspec", "serve", "--port", "0", "--model", args.model, "--ctx",
           str(args.ctx), *args.serve_arg]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write("  server: " + line)
        m = READY.search(line)
        if m:
            threading.Thread(target=lambda: [sys.stderr.write("  server: " + ln) for ln in proc.stderr or []],
                             daemon=True).start()
            return proc, m.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def run_client(name: str, cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str]:
    print(f"$ {' '.join(cmd)}", flush=True)
    try:
        done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return done.returncode, (done.stdout + done.stderr).strip()
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out.strip() + f"\n(timed out after {timeout:.0f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--serve-arg", action="append", default=[], help="one more `localspec serve` argument")
    ap.add_argument("--clients", default="claude,codex")
    ap.add_argument("--bin", help="a folder holding the `claude` and `codex` executables (default: PATH)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds each client may run")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--claude-arg", action="append", default=[], help="one more `claude` argument, e.g. "
                    "--claude-arg=--tools=Bash for a short prompt on a slow machine")
    ap.add_argument("--codex-arg", action="append", default=[], help="one more `codex exec` argument")
    ap.add_argument("--temperature", type=float, help="the proxy sets this temperature on requests that name "
                    "none: Codex sends none (OpenAI's default is 1.0) and has no setting for it")
    ap.add_argument("--claude-lean", action="store_true", help="Claude Code with the Bash tool alone and a short "
                    "system prompt with one example (a ~1k-token prompt instead of ~21k)")
    ap.add_argument("--save", help="a folder to write every request's body into (NNN-client.json)")
    ap.add_argument("--codex-lean", action="store_true", help="Codex without its long instructions and the "
                    "tools it does not need here (a ~4 KB prompt instead of ~41 KB)")
    args = ap.parse_args()

    server, url = start_server(args)
    proxy = Proxy(url)
    proxy.temperature = args.temperature
    if args.save:
        proxy.save = Path(args.save)
        proxy.save.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    results = {}
    try:
        for name in args.clients.split(","):
            exe = str(Path(args.bin) / name) if args.bin else shutil.which(name)
            if not exe or not Path(exe).exists():
                results[name] = (127, f"{name} not found (npm install -g @anthropic-ai/claude-code @openai/codex)")
                continue
            home = Path(tempfile.mkdtemp(prefix=f"localspec-{name}-"))
            work = home / "work"
            work.mkdir()
            (work / "hello.txt").write_text("hello\n")
            (work / "notes.md").write_text("# notes\n")
            env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "TERM": "dumb"}
            if name == "claude":
                env |= {"ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_API_KEY": "x", "API_TIMEOUT_MS": "3600000",
                        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}  # a CPU takes minutes on its 21k tokens
                cmd = [exe, "-p", args.prompt, "--max-turns", "4", "--allowedTools", "Bash(ls:*)", *args.claude_arg]
                if args.claude_lean:
                    cmd += ["--tools", "Bash", "--system-prompt", LEAN_INSTRUCTIONS.format(tool="Bash", arg="command")]
            else:
                (home / ".codex").mkdir()
                config = CODEX_CONFIG.format(model=args.model, url=proxy.url)
                if args.codex_lean:
                    (home / "instructions.md").write_text(LEAN_INSTRUCTIONS.format(tool="exec_command", arg="cmd"))
                    config = CODEX_LEAN.format(instructions=home / "instructions.md") + config
                (home / ".codex" / "config.toml").write_text(config)
                env |= {"CODEX_HOME": str(home / ".codex")}
                cmd = [exe, "exec", "--skip-git-repo-check", *args.codex_arg, args.prompt]
            proxy.client = name
            results[name] = run_client(name, cmd, env, work, args.timeout)
    finally:
        alive = server.poll() is None
        server.terminate()
        server.wait(30)
        proxy.shutdown()

    print("\n| client | request | asked | status | prompt tokens | bytes | seconds | error |\n"
          "|---|---|---|---|---|---|---|---|")
    for h in proxy.hits:
        print(h.row())
    for name, (code, out) in results.items():
        tail = "\n    ".join(out.splitlines()[-8:])
        print(f"\n{name}: exit {code}\n    {tail}")
    print(f"\nserver alive at the end: {alive}")
    return 0 if alive and all(code == 0 for code, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
