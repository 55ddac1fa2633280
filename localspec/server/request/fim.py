"""Fill-in-the-middle prompts from the GGUF's FIM special tokens, laid out as llama-server lays them out.

Editors (llama.vim, llama.vscode) send the text before the cursor, the text after it, and extra chunks from
other files; the model must see them in the token order it was trained on. That order comes from the GGUF:
`tokenizer.ggml.fim_{pre,suf,mid}_token_id` (older files: `tokenizer.ggml.{prefix,suffix,middle}_token_id`),
plus `fim_rep`/`fim_sep` for the repo-level form. We never guess FIM tokens from token text: a model that does
not declare them gets a clear error (`FimUnsupported`), not a silently wrong prompt.

Layout (PSM, as llama-server's README documents it: `prompt` "added after the FIM_MID token"):
    [extra] [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID prompt
where extra is, with FIM_REP/FIM_SEP:  FIM_REP "myproject\\n" (FIM_SEP filename "\\n" text)* FIM_SEP "filename\\n"
and without them: ("\\n\\n--- snippet ---\\n\\n" text)*.
Budgets follow llama-server: the prefix keeps its last 3/4 of a batch, the suffix its first 1/4 (minus the
prompt), extra chunks fill what the context has left after a batch and twice n_predict (the most recent text).
Two differences from llama-server's code, both for the prompt cache:
- `prompt` (the cursor line up to the cursor, which changes on every key) comes last, after FIM_MID, where the
  README puts it; llama-server's code appends it to the prefix, before FIM_SUF, so each key evaluates the
  whole suffix again (llama.cpp PR #22761 moves it to the README's place). A typed key then evaluates only
  the cursor line's changed tokens, whatever follows the cursor.
- A long prefix loses whole lines from its start in blocks of `PREFIX_BLOCK` lines rather than single tokens, so
  a one-line edit near the cursor does not shift where the prompt starts (which would leave nothing of the
  cached prefix reusable); a cut suffix gives way to the cursor line in blocks of `PROMPT_BLOCK` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ...errors import LocalspecError

if TYPE_CHECKING:  # the layout itself is pure: scripts and tests use it without loading llama.cpp
    from ...engine.engine import Engine
    from ..execution.worker import Build, Prompt

_KEYS = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
PREFIX_BLOCK = 16  # lines dropped at a time from the start of a prefix that does not fit
PROMPT_BLOCK = 32  # tokens: the cursor line's share of the suffix budget grows in these steps


class FimUnsupported(LocalspecError):
    """The model's GGUF declares no FIM tokens, so it cannot fill in the middle."""

    exit_code = 2


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None

    @property
    def repo_level(self) -> bool:
        return self.rep is not None and self.sep is not None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> "FimTokens | None":
        """FIM ids from GGUF metadata (values may be str, as llama.cpp reports them); None if pre/suf/mid lack."""
        found: dict[str, int | None] = {}
        for name, keys in _KEYS.items():
            found[name] = next((_as_id(meta[k]) for k in keys if k in meta and _as_id(meta[k]) is not None), None)
        if found["pre"] is None or found["suf"] is None or found["mid"] is None:
            return None
        return cls(**found)  # type: ignore[arg-type]


def _as_id(v: object) -> int | None:
    try:
        i = int(v)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return i if i >= 0 else None


def require_fim(meta: Mapping[str, str], model_name: str) -> FimTokens:
    fim = FimTokens.from_metadata(meta)
    if fim is None:
        raise FimUnsupported(f"model '{model_name}' declares no FIM tokens in its GGUF metadata "
                             "(tokenizer.ggml.fim_pre/suf/mid_token_id), so it cannot fill in the middle; "
                             "serve a FIM model (e.g. Qwen2.5-Coder) or send a plain completion without a suffix")
    return fim


def has_fim(meta: Mapping[str, str]) -> bool:
    """The GGUF declares FIM tokens (`/props`' `fim`, Ollama's "insert" capability)."""
    return FimTokens.from_metadata(meta) is not None


@dataclass(frozen=True)
class Extra:
    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class InfillPrompt:
    tokens: list[int]
    truncated: bool  # prefix, suffix or extra context was cut to fit


def build_infill(fim: FimTokens, tokenize: Callable[[str], list[int]], *, prefix: str, suffix: str,
                 prompt: str = "", extra: Sequence[Extra] = (), bos: int | None = None, n_ctx: int,
                 n_predict: int = 0, n_batch: int | None = None) -> InfillPrompt:
    """Token layout of the module docstring. `tokenize` turns text into tokens without BOS and without
    parsing special-token text (user code that contains "<fim_prefix>" stays text)."""
    n_batch = n_batch or max(16, n_ctx // 2)
    t_suffix, t_prompt = tokenize(suffix), tokenize(prompt)
    t_prefix, cut_prefix = fit_prefix(tokenize, prefix, 3 * (n_batch // 4))
    t_extra = _extra_tokens(fim, tokenize, extra)
    n_suffix = min(len(t_suffix), max(0, n_batch // 4 - (2 + _rounded(len(t_prompt)))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, 0)), len(t_extra))
    truncated = cut_prefix or n_suffix < len(t_suffix) or n_extra < len(t_extra)
    head = t_extra[len(t_extra) - n_extra:] + ([bos] if bos is not None else [])
    body = [fim.pre] + t_prefix + [fim.suf] + t_suffix[:n_suffix] + [fim.mid] + t_prompt
    return InfillPrompt(head + body, truncated)


def infill_build(fim: FimTokens, *, prefix: str, suffix: str, prompt: str = "", extra: Sequence[Extra] = (),
                 n_predict: int = 0) -> Build:
    """The job's prompt builder for a fill-in-the-middle request (`/infill`, `/v1/completions` and
    `/api/generate` with a suffix). It runs on the worker, with the target's tokenizer: no BOS (the layout places
    it), and special-token text in the user's code stays text."""
    def build(e: Engine) -> tuple[Prompt, bool]:
        t = e.target
        p = build_infill(fim, lambda s: t.tokenize(s, add_special=False, parse_special=False), prefix=prefix,
                         suffix=suffix, prompt=prompt, extra=extra, bos=t.bos if t.add_bos and t.bos >= 0 else None,
                         n_ctx=t.n_ctx, n_predict=n_predict)
        return p.tokens, p.truncated
    return build


def _rounded(n_prompt: int) -> int:
    """The prompt's share of the suffix budget, in whole PROMPT_BLOCKs: a key that adds a token to the cursor
    line then leaves a cut suffix as it was (a suffix one token shorter would be evaluated again)."""
    return -(-n_prompt // PROMPT_BLOCK) * PROMPT_BLOCK


def fit_prefix(tokenize: Callable[[str], list[int]], prefix: str, budget: int) -> tuple[list[int], bool]:
    """The prefix's tokens within `budget`, dropping whole lines from its start PREFIX_BLOCK at a time
    (a single overlong line is cut by tokens). Returns (tokens, whether anything was dropped)."""
    t = tokenize(prefix)
    if len(t) <= budget:
        return t, False
    lines = prefix.splitlines(keepends=True)
    per_line = len(t) / max(len(lines), 1)
    blocks = max(1, int((len(t) - budget) / per_line) // PREFIX_BLOCK)  # a guess from below, then step up
    for drop in range(blocks * PREFIX_BLOCK, len(lines), PREFIX_BLOCK):
        t = tokenize("".join(lines[drop:]))
        if len(t) <= budget:
            return t, True
    return t[len(t) - budget:] if budget > 0 else [], True


def _extra_tokens(fim: FimTokens, tokenize: Callable[[str], list[int]], extra: Sequence[Extra]) -> list[int]:
    out: list[int] = []
    if fim.rep is not None:
        out += [fim.rep] + tokenize(REPO_NAME)
    for chunk in extra:
        if fim.sep is not None:
            out += [fim.sep] + tokenize(chunk.filename + "\n")
        else:
            out += tokenize(SNIPPET_SEPARATOR)
        out += tokenize(chunk.text)
    if fim.sep is not None:
        out += [fim.sep] + tokenize(CURRENT_FILE)
    return out


def indent_cut(text: str, n_indent: int) -> int | None:
    """llama-server's `n_indent` rule: once a line after the first starts with less indentation than
    n_indent (and has content), generation stops and that line is dropped. Returns where to cut, or None."""
    if n_indent <= 0:
        return None
    start = text.find("\n")
    while start >= 0:
        pos = start + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] != "\n" and pos - (start + 1) < n_indent:
            return start + 1
        start = text.find("\n", start + 1)
    return None
