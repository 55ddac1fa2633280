"""Prompt lookup: localspec against llama.cpp's n-gram drafters, same model, prompt and threads, interleaved.

For each model and copy-heavy task (RAG, JSON extraction, a code rename, a rewrite of given text) and open prose,
runs per prompt, in turn: plain decoding (localspec, no drafter), localspec's default lookup (adaptive, match
buckets, as `localspec run --lookup` builds it; a fresh controller and index per prompt), and
`llama-speculative-simple --spec-type T` for each llama.cpp n-gram drafter T. Then the cross-request cache:
multi-turn chats, editor requests over one file and requests for tests of it, code completions accepted a line at
a time, prompt-only lookup against lookup with the cache (a table of each sequence as a whole, request by request).
Reports tok/s (decoding, prefill excluded), acceptance and drafted tokens side by side (not a test).

    python scripts/compare_lookup.py --threads 2 --max-tokens 128 --reps 3 --markdown docs/bench/lookup.md
    python scripts/compare_lookup.py --quick   # one prompt a task, 16 tokens: proves the script runs

llama.cpp binaries: LLAMA_CPP_BIN or --cpp-bin (build/bin of the llama.cpp that llama-cpp-python vendors); rows
for llama.cpp are left out when `llama-speculative-simple` is not there.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from localspec.backend import LoadOptions, Model
from localspec.bench.samples import (
    CHAT_TURNS,
    COMPLETION_PREFIX,
    EDITED_TURN,
    EDITOR_FILE,
    EDITOR_REQUESTS,
    LOOKUP_PROSE,
    LOOKUP_TASKS,
    NEW_CHAT_TURNS,
    TEST_REQUESTS,
)
from localspec.engine.engine import Engine
from localspec.engine.loader import EngineConfig, load_calibration, make_controller
from localspec.errors import LocalspecError
from localspec.models.resolve import resolve_model
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.reindent import Indents
from localspec.speculative.suffix import SuffixCache

Request = list[dict] | str  # chat messages, or a completion prompt as text
CPP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")  # llama.cpp's n-gram drafters, defaults


@dataclass(frozen=True)
class Result:
    model: str
    task: str
    config: str
    tok_s: float
    n: int
    drafted: int
    accepted: int
    prompt: int = 0  # which prompt of the task (the per-prompt table)
    rep: int = 0  # which pass over the tasks (the paired table: runs of one prompt in one pass, side by side)


def default_models() -> list[str]:
    """The embedded default model, and Gemma-3-270M when it is assembled (`localspec models pull gemma3-270m`,
    or the test suite, which shares that copy)."""
    out = [str(resolve_model(None, log=lambda *a: None).path)]
    try:
        out.append(str(resolve_model("gemma3-270m", log=lambda *a: None).path))
    except LocalspecError:  # not assembled: the comparison runs on the default model only
        pass
    return out


def cpp_run(bin_dir: Path, model: str, prompt: str, spec_type: str, a) -> tuple[float, int, int, int] | None:
    """(tok/s, tokens, drafted, accepted) from llama-speculative-simple's own report."""
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", model, "-p", prompt, "-n", str(a.max_tokens),
           "--temp", "0", "-t", str(a.threads), "-c", str(a.ctx), "-s", "1", "--spec-type", spec_type]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out)
    if r.returncode or not m:
        print(f"  llama.cpp {spec_type} failed (exit {r.returncode}): {out.strip()[-300:]}", file=sys.stderr)
        return None
    drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", out).group(1))
    accepted = int(re.search(r"n_accept\s*=\s*(\d+)", out).group(1))
    return float(m.group(2)), int(m.group(1)), drafted, accepted


def ours(engine: Engine, tokens: list[int], max_tokens: int, spec: bool = True) -> tuple[float, int, int, int]:
    """(tok/s, tokens, drafted, accepted): wall clock of the whole request minus its prefill."""
    return ours_text(engine, tokens, max_tokens, spec)[0]


def ours_text(engine: Engine, tokens: list[int], max_tokens: int, spec: bool = True):
    t0 = time.perf_counter()
    last, text = None, []
    for last in engine.generate(tokens, max_tokens=max_tokens, spec=spec):
        text.append(last.text)
    s = last.stats
    wall = time.perf_counter() - t0 - s.prompt_ms / 1e3
    return (s.n_generated / wall, s.n_generated, s.draft_n, s.draft_n_accepted), "".join(text)


class Bench:
    """One target model loaded once; engines over it for plain decoding and lookup."""

    def __init__(self, path: str, a) -> None:
        self.a, self.path, self.name = a, path, Path(path).name
        self.target = Model.load(path, LoadOptions(n_ctx=a.ctx, n_threads=a.threads))
        self.plain = Engine(self.target, None)
        spec, lookup = EngineConfig(model=path, threads=a.threads), PromptLookup()
        # the default controller, calibrated once; each prompt starts from a copy (a fresh `localspec run`)
        self.ctl0 = make_controller(spec, 4, lookup, load_calibration(spec, self.target, lookup, None))

    def lookup(self, cache: SuffixCache | None = None) -> Engine:
        return Engine(self.target, PromptLookup(cache=cache, indents=Indents.of(self.target)),
                      controller=copy.deepcopy(self.ctl0))

    def render(self, request: Request) -> tuple[list[int], str]:
        """Tokens for localspec and text for llama.cpp, the same prompt: llama.cpp adds BOS itself when the
        model asks for one, so a template's leading BOS text goes; where the model adds none (SmolLM2, whose
        BOS is `<|im_start|>`) the text stays whole (stripped, llama.cpp decoded another prompt). A request as
        text is a completion prompt, sent as it is (an editor's code completion)."""
        if isinstance(request, str):
            return self.plain.tokenize(request, special=False), request
        text = self.plain.chat_prompt(request) if self.plain.chat_template else request[-1]["content"]
        t = self.target
        bos = t.token_text(t.bos) if t.add_bos and t.bos >= 0 else ""
        return self.plain.tokenize(text), text[len(bos):] if bos and text.startswith(bos) else text

    def fresh(self) -> None:
        self.target.rewind(0)  # every run pays its own prefill (excluded from tok/s)


def run_tasks(b: Bench, tasks: dict[str, list[str]], a, bin_dir: Path | None) -> list[Result]:
    """Per prompt, interleaved (a noisy neighbour hits every config alike): llama.cpp's drafters first, then
    plain decoding and localspec for as many tokens as the longest llama.cpp run decoded. llama.cpp does not cut
    its last draft at -n (with ngram-mod's 48-64-token drafts a 128-token request decodes up to 193), and the
    tokens of a long last draft come cheap: compared at -n alone, its tok/s would count tokens localspec was
    never asked for."""
    out: list[Result] = []
    for rep in range(a.reps):
        for task, prompts in tasks.items():
            for i, p in enumerate(prompts):
                toks, text = b.render([{"role": "user", "content": p}])
                cpp = []
                for t in CPP_TYPES if bin_dir else ():
                    b.fresh()
                    if r := cpp_run(bin_dir, b.path, text, t, a):
                        cpp.append(Result(b.name, task, f"llama.cpp {t}", *r, prompt=i, rep=rep))
                n = max([a.max_tokens] + [r.n for r in cpp])
                runs = {"plain": lambda: ours(b.plain, toks, n, spec=False),
                        "localspec lookup": lambda: ours(b.lookup(), toks, n)}
                for config, fn in runs.items():
                    b.fresh()
                    out.append(Result(b.name, task, config, *fn(), prompt=i, rep=rep))
                out += cpp
    return out


NEW_CHAT = None  # in a chat sequence: the user starts a new chat (the history goes; the engine and its cache stay)
ACCEPT_LINE = "accept a line"  # in a completion sequence: the last prompt and the last answer's first line
EDIT = "edit"  # in a chat sequence: the user edits their last message (its exchange leaves the history) and resends


def sequences() -> dict[str, list[str | None]]:
    """The request sequences: a chat (each turn sees the history, so every earlier answer is in the prompt), the
    same document in a new chat after two turns (the first chat's answers are in no prompt, only in the cache),
    a chat whose user edits a question and sends it again (the first answer to it is in no prompt after that),
    editor edits of one file, tests for it, and editor edits each sent twice (the user rejects a completion and
    asks again, or the plugin sends the request again after the cursor moved), and code completions of which the
    user accepts a line at a time (the rest of the last suggestion is in no prompt, only in the cache)."""
    def file(r: str) -> str:
        return f"Here is my file:\n```python\n{EDITOR_FILE}```\n{r}"
    return {"chat": CHAT_TURNS, "chat, then a new chat": [*CHAT_TURNS[:2], NEW_CHAT, *NEW_CHAT_TURNS],
            "chat, a question edited": [*CHAT_TURNS[:2], EDIT, EDITED_TURN, CHAT_TURNS[2]],
            "editor": [file(r) for r in EDITOR_REQUESTS], "tests": [file(r) for r in TEST_REQUESTS],
            "editor, asked twice": [file(r) for r in EDITOR_REQUESTS for _ in range(2)],
            "completion, a line accepted at a time": [COMPLETION_PREFIX, ACCEPT_LINE, ACCEPT_LINE, ACCEPT_LINE]}


def first_line(text: str) -> str:
    """What an editor's "accept line" takes of a suggestion: up to the end of its first line with text."""
    return re.match(r"\s*[^\n]*\n?", text).group(0)


def converse(seq: str, turns: list[str | None], ask: Callable[[Request], str], limit: int) -> None:
    """Send a sequence's first `limit` requests in order, `ask(request) -> answer text`; a chat keeps its
    history (answers included) until `NEW_CHAT`, less the last exchange at `EDIT`; a completion sequence's
    `ACCEPT_LINE` sends the last prompt with the first line of the last answer accepted."""
    history: list[dict] = []
    sent, request, answer = 0, "", ""
    for turn in turns:
        if sent == limit:
            return
        if turn is NEW_CHAT or turn is EDIT:
            history = [] if turn is NEW_CHAT else history[:-2]
            continue
        if seq.startswith("completion"):
            request = request + first_line(answer) if turn is ACCEPT_LINE else turn
        else:
            request = history + [{"role": "user", "content": turn}]
        answer = ask(request)
        sent += 1
        if seq.startswith("chat"):
            history = request + [{"role": "assistant", "content": answer}]


SEQUENCE_CONFIGS = ("plain", "lookup, prompt only", "lookup + cache")


def run_sequences(b: Bench, a) -> list[Result]:
    """A multi-turn chat and editor requests over one file: prompt-only lookup vs lookup with the cache (one
    engine per config and sequence, as a chat session or an editor's server would keep it). The engines go in
    lockstep, each request sent to all three one after another, so each request's runs are seconds apart (the
    paired columns); every engine keeps its own drafter, cache and controller, and the history is plain
    decoding's answers (greedy: the same text every engine writes, up to batch numerics)."""
    out: list[Result] = []
    for rep in range(a.reps):
        for seq, turns in sequences().items():
            engines = {c: b.plain if c == "plain" else b.lookup(SuffixCache() if "cache" in c else None)
                       for c in SEQUENCE_CONFIGS}
            number = itertools.count()

            def ask(request: Request) -> str:
                i, answers = next(number), {}
                for config, engine in engines.items():
                    b.fresh()
                    r, answers[config] = ours_text(engine, b.render(request)[0], a.max_tokens,
                                                   spec=config != "plain")
                    out.append(Result(b.name, f"{seq} ({a.turns} requests)", config, *r, prompt=i, rep=rep))
                return answers["plain"]
            converse(seq, turns, ask, a.turns)
    return out


def table(results: list[Result]) -> str:
    """Markdown: one row per model × task × config; tok/s is the median over prompts and repeats."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.model, r.task, r.config), []).append(r)
    med = {k: statistics.median(r.tok_s for r in v) for k, v in groups.items()}
    lines = ["| model | task | config | tok/s | × plain | × best llama.cpp | accepted / drafted |",
             "|---|---|---|---|---|---|---|"]
    for (model, task, config), v in groups.items():
        tps = med[(model, task, config)]
        plain = med.get((model, task, "plain"))
        cpp = [x for (m, t, c), x in med.items() if (m, t) == (model, task) and c.startswith("llama.cpp")]
        acc, dr = sum(r.accepted for r in v), sum(r.drafted for r in v)
        cells = [model, task, config, f"{tps:.1f}", f"{tps / plain:.2f}" if plain else "–",
                 f"{tps / max(cpp):.2f}" if cpp else "–", f"{acc}/{dr} ({100 * acc / dr:.0f} %)" if dr else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_prompt(results: list[Result]) -> str:
    """Markdown: each task prompt on its own (medians over the repeats): a task's median over prompts hides
    which prompts copy (there speculation can win) and which do not (there every config is plain at best)."""
    groups: dict[tuple[str, str, int, str], list[float]] = {}
    for r in results:
        if not r.config.startswith("llama.cpp") and r.config not in ("plain", "localspec lookup"):
            continue  # the request sequences
        groups.setdefault((r.model, r.task, r.prompt, r.config), []).append(r.tok_s)
    med = {k: statistics.median(v) for k, v in groups.items()}
    lines = ["| model | task | prompt | plain | localspec lookup | best llama.cpp | localspec ÷ it |",
             "|---|---|---|---|---|---|---|"]
    for (model, task, prompt) in dict.fromkeys(k[:3] for k in med):
        cpp = {c: x for (m, t, p, c), x in med.items() if (m, t, p) == (model, task, prompt) and c.startswith("llama")}
        ours, plain = med.get((model, task, prompt, "localspec lookup")), med.get((model, task, prompt, "plain"))
        if ours is None or plain is None:
            continue
        best = max(cpp, key=cpp.get) if cpp else None
        cells = [model, task, str(prompt + 1), f"{plain:.1f}", f"{ours:.1f} ({ours / plain:.2f}× plain)",
                 f"{cpp[best]:.1f} ({best[len('llama.cpp '):]})" if best else "–",
                 f"{ours / cpp[best]:.2f}" if best else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired(results: list[Result]) -> str:
    """Markdown: per task, localspec's run of a prompt divided by plain decoding's and by llama.cpp's best
    drafter's run of the same prompt in the same pass (they ran one after another), the geometric mean over
    those pairs. This machine's speed drifts by ±10 % over a run; a ratio of two runs a few seconds apart
    cancels that drift, a ratio of medians over the whole run does not. "Best" is the drafter with the highest
    median tok/s on the task, chosen before pairing (the best of four noisy runs, pair by pair, would favour
    llama.cpp by its noise)."""
    runs: dict[tuple[str, str], dict[tuple[int, int], dict[str, float]]] = {}
    for r in results:
        if not r.task.endswith(" requests)"):  # the request sequences have their own table
            runs.setdefault((r.model, r.task), {}).setdefault((r.prompt, r.rep), {})[r.config] = r.tok_s
    lines = ["| model | task | localspec ÷ plain | localspec ÷ best llama.cpp | pairs |", "|---|---|---|---|---|"]
    for (model, task), by_pass in runs.items():
        cpp = {c for p in by_pass.values() for c in p if c.startswith("llama.cpp")}
        best = max(cpp, key=lambda c: statistics.median(p[c] for p in by_pass.values() if c in p)) if cpp else None
        both = [p for p in by_pass.values() if "localspec lookup" in p and "plain" in p]
        to_best = [p["localspec lookup"] / p[best] for p in both if best in p]
        cells = [model, task, f"{geomean([p['localspec lookup'] / p['plain'] for p in both]):.2f}",
                 f"{geomean(to_best):.2f} ({best[len('llama.cpp '):]})" if to_best else "–", str(len(both))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def sequence_table(results: list[Result]) -> str:
    """Markdown: the request sequences as a whole (tokens over decoding time, every request and repeat), the
    share of tokens that came from accepted drafts, and each request's tok/s (median over the repeats): the
    cache can only help from the second request on, and a median over requests would hide that. The paired
    columns divide each request's run by the other config's run of it in the same pass (seconds apart:
    `run_sequences`), geometric mean over requests and passes: this machine's drift cancels there."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        if r.task.endswith(" requests)"):
            groups.setdefault((r.model, r.task, r.config), []).append(r)
    speed = {k: sum(r.n for r in v) / sum(r.n / r.tok_s for r in v) for k, v in groups.items()}
    run = {(r.model, r.task, r.config, r.prompt, r.rep): r.tok_s for v in groups.values() for r in v}

    def pairs(model: str, seq: str, config: str, other: str) -> str:
        """The geometric mean of this config's request over another's same request in the same pass."""
        xs = [t / run[k] for (m, s, c, i, rep), t in run.items() if (m, s, c) == (model, seq, config)
              and (k := (m, s, other, i, rep)) in run]
        return f"{geomean(xs):.2f}" if xs and config != other else "–"
    lines = ["| model | sequence | config | tok/s | × plain | × prompt only | paired × plain | paired × prompt only "
             "| tokens from drafts | tok/s per request |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, seq, config), v in groups.items():
        plain, only = speed.get((model, seq, "plain")), speed.get((model, seq, "lookup, prompt only"))
        per = [statistics.median(r.tok_s for r in v if r.prompt == i) for i in sorted({r.prompt for r in v})]
        x = speed[(model, seq, config)]
        drafts = 100 * sum(r.accepted for r in v) / sum(r.n for r in v)
        cells = [model, seq, config, f"{x:.1f}", f"{x / plain:.2f}" if plain else "–",
                 f"{x / only:.2f}" if only and config != "plain" else "–",
                 pairs(model, seq, config, "plain"),
                 pairs(model, seq, config, "lookup, prompt only") if config != "plain" else "–",
                 f"{drafts:.0f} %", " / ".join(f"{t:.0f}" for t in per)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", help="GGUF path (repeat); default: SmolLM2-135M Q4_1 and Gemma-3-270M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--per-task", type=int, default=3)
    ap.add_argument("--turns", type=int, default=len(CHAT_TURNS))
    ap.add_argument("--task", action="append", help="only this task (repeat); default: all")
    ap.add_argument("--no-sequences", action="store_true", help="leave out the chat and editor sequences")
    ap.add_argument("--cpp-bin", default=os.environ.get("LLAMA_CPP_BIN", ""))
    ap.add_argument("--quick", action="store_true", help="one prompt a task, 16 tokens, 2 turns")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args()
    if a.quick:
        a.per_task, a.max_tokens, a.turns, a.reps = 1, 16, 2, 1
    bin_dir = Path(a.cpp_bin) if a.cpp_bin and (Path(a.cpp_bin) / "llama-speculative-simple").exists() else None
    if bin_dir is None:
        print("llama-speculative-simple not found (--cpp-bin / LLAMA_CPP_BIN): llama.cpp rows left out",
              file=sys.stderr)
    tasks = {t: ps[:a.per_task] for t, ps in {**LOOKUP_TASKS, "prose": LOOKUP_PROSE}.items()
             if not a.task or t in a.task}
    results: list[Result] = []
    for path in a.model or default_models():
        b = Bench(path, a)
        results += run_tasks(b, tasks, a, bin_dir)
        if not a.no_sequences:
            results += run_sequences(b, a)
        b.target.close()
    md = (table(results) + "\n\nPaired (each prompt's runs in one pass, side by side; geometric mean):\n\n"
          + paired(results) + "\n\nPer prompt (medians over the repeats):\n\n" + per_prompt(results))
    if not a.no_sequences:
        md += "\n\nThe request sequences, whole:\n\n" + sequence_table(results)
    cmd = "python scripts/compare_lookup.py " + " ".join(sys.argv[1:])
    print(md)
    if a.markdown:
        Path(a.markdown).write_text(f"# Prompt lookup vs llama.cpp's n-gram drafters\n\nCommand: `{cmd}`\n\n"
                                    f"{md}\n", encoding="utf-8")
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in results], indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
