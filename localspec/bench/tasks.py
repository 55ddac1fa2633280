"""Bench prompts: the built-in task set (tasks.jsonl, written for this project) and the user's own JSONL.

Tasks cover what Spec-Bench / SPEED-Bench cover and what editors send: code completion (raw prefixes),
code editing (rewrite a given block: the answer copies the input, prompt lookup's best case), chat, RAG-style
answering from a given document, structured JSON extraction, and open prose (little to copy: lookup's worst).
A prompt with `chat: true` is wrapped in the model's chat template when the GGUF has one; base models
(no template) get the raw text, which is what they were trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import LocalspecError

TASKS = ("code", "edit", "chat", "rag", "json", "prose")


class BenchInputError(LocalspecError):
    """A prompts file or a log file the bench cannot read."""

    exit_code = 2


@dataclass(frozen=True)
class Prompt:
    task: str
    id: str
    prompt: str
    chat: bool = True  # wrap in the chat template when the model has one


def parse_jsonl(lines: Iterable[str], source: str) -> list[Prompt]:
    """One JSON object a line: {"task": ..., "prompt": ...} (+ optional "id", "chat"); blank lines skipped."""
    out: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchInputError(f"{source}:{n}: not valid JSON ({e.msg}); one JSON object per line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise BenchInputError(f"{source}:{n}: needs a non-empty \"prompt\" string "
                                  "(and a \"task\" label), e.g. {\"task\": \"chat\", \"prompt\": \"Hi\"}")
        task = str(obj.get("task") or "custom")
        out.append(Prompt(task, str(obj.get("id") or f"{task}-{n}"), obj["prompt"], bool(obj.get("chat", True))))
    if not out:
        raise BenchInputError(f"{source} has no prompts")
    return out


def builtin_prompts() -> list[Prompt]:
    text = resources.files("localspec.bench").joinpath("tasks.jsonl").read_text(encoding="utf-8")
    return parse_jsonl(text.splitlines(), "tasks.jsonl")


def load_prompts(path: str | Path) -> list[Prompt]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise BenchInputError(f"prompts file not found: {p} (JSONL: one {{\"task\", \"prompt\"}} object a line)")
    with p.open(encoding="utf-8") as f:
        return parse_jsonl(f, str(p))


def select(prompts: Sequence[Prompt], tasks: Sequence[str] | None = None,
           per_task: int | None = None) -> list[Prompt]:
    """Keep the named tasks (all when None), at most `per_task` prompts each, in file order."""
    known = {p.task for p in prompts}
    if tasks:
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise BenchInputError(f"unknown task(s) {', '.join(unknown)}; available: {', '.join(sorted(known))}")
    kept: list[Prompt] = []
    count: dict[str, int] = {}
    for p in prompts:
        if tasks and p.task not in tasks:
            continue
        if per_task is not None and count.get(p.task, 0) >= per_task:
            continue
        count[p.task] = count.get(p.task, 0) + 1
        kept.append(p)
    return kept
