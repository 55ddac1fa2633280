"""Bench prompts: the built-in task set (tasks.jsonl, written for this project) and the user's own JSONL.

Tasks cover what Spec-Bench / SPEED-Bench cover and what editors send: code completion (raw prefixes),
code editing (rewrite a given block: the answer copies the input, prompt lookup's best case), chat, RAG-style
answering from a given document, structured JSON extraction, and open prose (little to copy: lookup's worst).
A prompt with `chat: true` is wrapped in the model's chat template when the GGUF has one; base models
(no template) get the raw text, which is what they were trained on.

Structured tasks carry the grammar every configuration decodes under: `json-schema` (extraction with a JSON
schema, `"schema"`) and `tools` (a required call among `"tools"`, in the generic format of
engine/toolgrammar.py: its instructions before the request, its schema as the grammar). A grammar makes the
structure drafter's rows worth running (runner.configs_for adds them), so these tasks run only when named
(`--tasks tools,json-schema`): the default bench stays what it was (docs/bench/structure.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from ..errors import LocalspecError

if TYPE_CHECKING:
    from ..backend import Model
    from ..sampling.params import SamplingParams

TASKS = ("code", "edit", "chat", "rag", "json", "prose")
STRUCTURED = ("tools", "json-schema")  # tasks with a grammar: run when named


class BenchInputError(LocalspecError):
    """A prompts file or a log file the bench cannot read."""

    exit_code = 2


@dataclass(frozen=True)
class Prompt:
    task: str
    id: str
    prompt: str
    chat: bool = True  # wrap in the chat template when the model has one
    schema: str | None = None  # a JSON schema (JSON text) every configuration's output is constrained to
    opt_in: bool = False  # run only when its task is named (the built-in STRUCTURED tasks)


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
        prompt, schema = _structure(obj, f"{source}:{n}")
        out.append(Prompt(task, str(obj.get("id") or f"{task}-{n}"), prompt, bool(obj.get("chat", True)), schema))
    if not out:
        raise BenchInputError(f"{source} has no prompts")
    return out


def _structure(obj: dict, where: str) -> tuple[str, str | None]:
    """(prompt text, JSON schema text or None): a `"schema"` as given; `"tools"` as a required single call in
    the generic tool format (the instructions a model without tool syntax gets, then the request)."""
    from ..engine.toolgrammar import generic_instructions, generic_schema

    prompt, schema, tools = obj["prompt"], obj.get("schema"), obj.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("name") for t in tools):
            raise BenchInputError(f"{where}: \"tools\" must be a list of functions with a \"name\"")
        prompt = generic_instructions(tools, required=True, parallel=False) + "\n\n" + prompt
        schema = generic_schema(tools, required=True, parallel=False)
    if schema is not None and not isinstance(schema, dict):
        raise BenchInputError(f"{where}: \"schema\" must be a JSON schema object")
    return prompt, json.dumps(schema) if schema is not None else None


def builtin_prompts() -> list[Prompt]:
    text = resources.files("localspec.bench").joinpath("tasks.jsonl").read_text(encoding="utf-8")
    return [replace(p, opt_in=p.task in STRUCTURED) for p in parse_jsonl(text.splitlines(), "tasks.jsonl")]


def load_prompts(path: str | Path) -> list[Prompt]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise BenchInputError(f"prompts file not found: {p} (JSONL: one {{\"task\", \"prompt\"}} object a line)")
    with p.open(encoding="utf-8") as f:
        return parse_jsonl(f, str(p))


def select(prompts: Sequence[Prompt], tasks: Sequence[str] | None = None,
           per_task: int | None = None) -> list[Prompt]:
    """Keep the named tasks (all but the opt-in ones when None), at most `per_task` prompts each, in file
    order."""
    known = {p.task for p in prompts}
    if tasks:
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise BenchInputError(f"unknown task(s) {', '.join(unknown)}; available: {', '.join(sorted(known))}")
    kept: list[Prompt] = []
    count: dict[str, int] = {}
    for p in prompts:
        wanted = p.task in tasks if tasks else not p.opt_in
        if not wanted:
            continue
        if per_task is not None and count.get(p.task, 0) >= per_task:
            continue
        count[p.task] = count.get(p.task, 0) + 1
        kept.append(p)
    return kept


def constrained(params: "SamplingParams", p: Prompt, model: "Model") -> "SamplingParams":
    """`params` with `p`'s grammar as a fresh constraint (one Constraint serves one generation), or `params`
    as they are for a prompt without one."""
    if p.schema is None:
        return params
    from ..sampling.constrain import build_constraint

    return replace(params, constraint=build_constraint(model, grammar=_gbnf(p.schema)))


@lru_cache(maxsize=64)
def _gbnf(schema: str) -> str:
    from ..backend import json_schema_grammar

    return json_schema_grammar(json.loads(schema))
