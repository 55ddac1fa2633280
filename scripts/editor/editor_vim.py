"""Drive the real llama.vim plugin in a real Vim, in tmux, against `localspec serve` (not a test: needs vim with
+textprop, tmux, curl and a checkout of llama.vim).

Starts the server on a free port, opens a Python file in Vim with llama.vim on the runtimepath, types a line
key by key as a person would, waits for the ghost text and llama.vim's info line (`| c: … | p: … | g: …`), saves
the pane, presses Tab, and checks that the suggestion landed in the buffer. Prints the captured panes and the
server's request log; exits 1 if a step did not happen.

Usage: python scripts/editor/editor_vim.py --llama-vim DIR [--model FIM.gguf] [--out DIR]
(DIR: `git clone https://github.com/ggml-org/llama.vim`; the model must have FIM tokens, e.g. a Qwen2.5-Coder
GGUF; the default is the FIM-tagged SmolLM2 that the test fixtures write, tests/conftest.py.)
"""

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from localspec.models.paths import cache_dir

SESSION = "localspec-vim"
INFO = re.compile(r"\| c: \d+, r: \d+/\d+.*\| p: \d+ \([\d.]+ ms, [\d.]+ t/s\) \| g: \d+ \([\d.]+ ms")
SOURCE = '''"""Shopping cart helpers."""


def cart_total(items):
    """Sum of price times quantity."""
    total = 0
    for item in items:
        total += item["price"] * item["qty"]
    return total


def cart_count(items):
    """Number of units in the cart."""
    count = 0
'''
TYPED = "for item in items:"  # Vim indents the new line itself


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen:
    """`localspec serve` as a user starts it; returns once /health answers."""
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--model", str(model), "--port", str(port),
                             "--ctx", "4096"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"error: the server exited ({proc.returncode}); its log: {log}")
            time.sleep(0.2)
    sys.exit("error: the server did not answer /health in 120 s")


def vimrc(path: Path, plugin: Path, port: int) -> None:
    path.write_text(f"""set nocompatible noswapfile nobackup laststatus=2 shortmess+=I
set runtimepath^={plugin}
let g:llama_config = {{'endpoint_fim': 'http://127.0.0.1:{port}/infill', 'show_info': 2, 'auto_fim': v:true}}
filetype plugin indent on
""")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def pane() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait_for(pattern: re.Pattern, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = pane()
        if pattern.search(text):
            return text
        time.sleep(0.1)
    return None


def suggestion(shown: str) -> list[str]:
    """The ghost text: on the typed line, what follows the typed text up to llama.vim's info line; then the
    lines llama.vim shows below it (the cursor is on the file's last line, so every row after it up to Vim's
    `~` filler is ghost text)."""
    rows = shown.splitlines()
    at = next(i for i, row in enumerate(rows) if TYPED in row and INFO.search(row))
    below = []
    for row in rows[at + 1:]:
        if row.startswith("~"):
            break
        below.append(row)
    return [rows[at].split(TYPED, 1)[1].split("    | c: ", 1)[0]] + below


def landed(ghost: list[str], added: str) -> bool:
    """Tab put the suggestion into the buffer: its first line after the typed text, the rest as the next lines
    (compared without their leading blanks: the ghost lines are drawn further in than Tab inserts them)."""
    lines = added.splitlines()
    at = next((i for i, line in enumerate(lines) if TYPED + ghost[0] in line), None)
    if at is None or not "".join(ghost).strip():
        return False
    return [g.strip() for g in ghost[1:]] == [line.strip() for line in lines[at + 1:at + len(ghost)]]


def type_keys(text: str, delay: float = 0.08) -> None:
    """One key at a time, with a typist's pause: every key moves the cursor, so llama.vim sends (and abandons)
    a request per key, as it does for a person."""
    for ch in text:
        tmux("send-keys", "-t", SESSION, "-l", ch)
        time.sleep(delay)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-vim", type=Path, required=True, help="a checkout of github.com/ggml-org/llama.vim")
    ap.add_argument("--model", type=Path, default=cache_dir() / "fixtures" / "SmolLM2-135M-Instruct.fim.Q4_1.gguf")
    ap.add_argument("--out", type=Path, default=Path("editor-vim-out"))
    args = ap.parse_args()
    for tool in ("vim", "tmux", "curl"):
        if shutil.which(tool) is None:
            sys.exit(f"error: {tool} is not installed")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="localspec-vim-"))
    src, rc = work / "cart.py", work / "vimrc"
    src.write_text(SOURCE)
    port = free_port()
    vimrc(rc, args.llama_vim.resolve(), port)
    server = start_server(args.model, port, args.out / "server.log")
    ok = False
    try:
        tmux("new-session", "-d", "-s", SESSION, "-x", "140", "-y", "30", f"vim -Nu {rc} {src}")
        time.sleep(1.0)
        tmux("send-keys", "-t", SESSION, "G", "o")  # a new line under `count = 0`, in insert mode
        time.sleep(0.3)
        type_keys(TYPED)
        shown = wait_for(INFO, 30)
        (args.out / "1-suggestion.txt").write_text(shown or pane())
        print("--- the pane with the suggestion (ghost text and llama.vim's info line):\n" + (shown or pane()))
        if shown is None:
            print("error: no suggestion appeared within 30 s")
            return 1
        tmux("send-keys", "-t", SESSION, "Tab")
        time.sleep(0.5)
        tmux("send-keys", "-t", SESSION, "Escape", ":w", "Enter")
        time.sleep(0.5)
        accepted = pane()
        (args.out / "2-accepted.txt").write_text(accepted)
        print("--- after Tab (the suggestion is now text in the buffer) and :w:\n" + accepted)
        ghost = suggestion(shown)
        added = src.read_text()[len(SOURCE):]
        print(f"--- the ghost text was {ghost!r}; the buffer gained:\n{added}")
        ok = landed(ghost, added)
        if not ok:
            print("error: Tab did not insert the suggestion")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        server.terminate()
        server.wait(timeout=30)
        print("--- the server's log:\n" + (args.out / "server.log").read_text()[-3000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
