"""llama-server's routes: `/infill` (what llama.vim and llama.vscode call), `/completion`, `/health`, `/props`,
`/tokenize`, `/detokenize`, `/apply-template`.

Responses use llama-server's field names (`content`, `stop`, `tokens_cached`, `timings{...}`) so editor plugins
read them unchanged; `timings` also carries `draft_n`/`draft_n_accepted`, and `speculative` says whether
speculation ran for this request. Streaming is SSE: `data: {...}` lines, the last one with `stop: true`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, AsyncIterator, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from ..engine.engine import Chunk, Engine
from ..errors import LocalspecError
from ..sampling.logprobs import TokenLogprob
from .chat import chat_messages_prompt
from .common import (
    ApiError,
    Build,
    Choice,
    ClientGone,
    Run,
    State,
    error_event,
    plan,
    progress,
    sampling,
    spec_policy,
    speculative,
    stops,
)
from .fim import Extra, FimTokens, build_infill, indent_cut, require_fim
from .probs import llama_probs, window
from .prompts import One, check_ids, mixed_tokens, prompt_input, split_prompts
from .samplers import ORDER, chained, parse_samplers
from .schemas import MAX_CHOICES, CompletionRequest, DetokenizeRequest, InfillRequest, OAIChatRequest, TokenizeRequest
from .structured import request_extras
from .worker import Job, Prompt

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}  # llama-server's


def router(state: State) -> APIRouter:
    r = APIRouter(tags=["llama.cpp"])

    @r.get("/health")
    @r.get("/v1/health", include_in_schema=False)
    async def health() -> Response:
        if not state.worker.alive():
            return JSONResponse({"error": {"code": 503, "message": "generation worker is not running",
                                           "type": "unavailable_error"}}, status_code=503)
        return JSONResponse({"status": "ok"})

    @r.get("/props")
    async def props() -> dict[str, Any]:
        """llama-server's fields (one slot: the one generation worker), then ours (`drafter`, `k`, `fim`...)."""
        e, t = state.engine, state.engine.target
        return {"default_generation_settings": default_settings(state), "total_slots": 1,
                "model_alias": state.model_name, "model_path": str(t.path),
                "modalities": {"vision": False, "audio": False},
                "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True, "webui": False,
                "chat_template": e.chat_template or "",
                "bos_token": t.token_text(t.bos) if t.bos >= 0 else "",
                "eos_token": t.token_text(t.eos) if t.eos >= 0 else "",
                "build_info": f"localspec {__version__}", "is_sleeping": False,
                "model": state.model_name, "n_ctx": state.n_ctx, "drafter": e.drafter_name, "k": spec_policy(e)[0],
                "fim": require_fim_ok(e), "spec_max_queue": state.config.spec_max_queue, "devices": devices_in_use(e)}

    @r.post("/completion")
    @r.post("/completions", include_in_schema=False)
    async def completion(req: CompletionRequest, request: Request) -> Response:
        # like llama-server, the llama.cpp routes ignore `model`: there is one
        state.metrics.request("/completion")
        prompts = split_prompts(req.prompt)
        for p in prompts:
            if isinstance(p, list):
                check_ids(p, state.engine.target.n_vocab)
        return await _answer(state, req, request, [_plain(p) for p in prompts])

    @r.post("/infill")
    async def infill(req: InfillRequest, request: Request) -> Response:
        state.metrics.request("/infill")
        fim = require_fim(state.engine.metadata, state.engine.name)
        n_predict = req.n_predict if req.n_predict and req.n_predict > 0 else 0
        cursor = _text(req.prompt)

        def build(e: Engine) -> tuple[Prompt, bool]:
            t = e.target
            p = build_infill(fim, lambda s: t.tokenize(s, add_special=False, parse_special=False),
                             prefix=req.input_prefix, suffix=req.input_suffix, prompt=cursor,
                             extra=[Extra(c.text, c.filename) for c in req.input_extra],
                             bos=t.bos if t.add_bos and t.bos >= 0 else None, n_ctx=t.n_ctx, n_predict=n_predict)
            return p.tokens, p.truncated

        return await _answer(state, req, request, [build])

    @r.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        # the vocabulary is read-only: llama-server too tokenizes outside its generation loop
        t = state.engine.target
        if isinstance(req.content, list):  # llama-server's mixed form: ids kept, text pieces tokenized
            check_ids(req.content, t.n_vocab, "token ids")
            toks = mixed_tokens(state.engine, req.content, add_special=req.add_special,
                                parse_special=req.parse_special)
        else:
            toks = t.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
        if not req.with_pieces:
            return {"tokens": toks}
        return {"tokens": [{"id": i, "piece": _piece(t.piece(i))} for i in toks]}

    @r.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, str]:
        t = state.engine.target
        bad = [i for i in req.tokens if not 0 <= i < t.n_vocab]
        if bad:
            raise ApiError(400, f"token ids must be in [0, {t.n_vocab}), got {bad[0]}")
        return {"content": t.detokenize(req.tokens)}

    @r.post("/apply-template")
    async def apply_template(req: OAIChatRequest) -> dict[str, str]:
        return {"prompt": chat_messages_prompt(state.engine, req)}

    @r.post("/v1/chat/completions/input_tokens")
    @r.post("/chat/completions/input_tokens", include_in_schema=False)
    async def chat_input_tokens(req: OAIChatRequest) -> dict[str, Any]:
        """The prompt tokens a chat request would evaluate (its template applied), without generating."""
        n = len(state.engine.tokenize(chat_messages_prompt(state.engine, req)))
        return {"object": "response.input_tokens", "input_tokens": n}

    return r


def _plain(prompt: One) -> Build:
    def build(e: Engine) -> tuple[Prompt, bool]:
        return prompt_input(e, prompt), False
    return build


def default_settings(state: State) -> dict[str, Any]:
    """llama-server's `default_generation_settings`: the slot (here: the worker) and the defaults a request
    without sampling fields runs with."""
    n = state.config.n_predict if state.config.n_predict is not None else -1
    policy, k = spec_policy(state.engine)
    params = {**DEFAULTS, "seed": -1, "top_n_sigma": -1.0, "typical_p": 1.0, "repeat_last_n": 64,
              "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "max_tokens": n,
              "n_predict": n, "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": False, "n_probs": 0,
              "min_keep": 0, "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
              "speculative.n_max": k, "speculative.n_min": 0, "speculative.policy": policy,
              "timings_per_token": False, "post_sampling_probs": False, "lora": []}
    return {"id": 0, "id_task": -1, "n_ctx": state.n_ctx, "speculative": state.engine.drafter is not None,
            "is_processing": state.worker.busy, "params": params, "prompt": "",
            "next_token": {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0,
                           "stopping_word": ""}}


def devices_in_use(e: Engine) -> list[dict[str, Any]]:
    """ggml's devices with their free/total memory (an RPC device's as its server reports it); `target` marks
    the ones the target's offloaded layers use (`--rpc` servers first, then local GPUs)."""
    from ..backend import devices

    used = set(e.target.offload_devices)
    return [{**d, "target": d["name"] in used} for d in devices()]


def _piece(b: bytes) -> str | list[int]:
    """llama-server's `with_pieces`: the text when it is valid UTF-8, else the byte values."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def require_fim_ok(e: Engine) -> bool:
    return FimTokens.from_metadata(e.metadata) is not None


def _text(prompt: object) -> str:
    if not isinstance(prompt, str):
        raise ApiError(400, "/infill takes `prompt` as text (the part of the current line before the cursor)")
    return prompt


def _job(state: State, req: CompletionRequest, choice: Choice) -> Job:
    """One choice's job; its constraint (grammar state) is its own, its seed the choice's."""
    chain = parse_samplers(req.samplers)
    base = chained(chain, state, sampling(req.temperature, req.top_k, req.top_p, req.min_p, req.seed,
                                          defaults=DEFAULTS, penalties=req))
    ask = window(req.n_probs, base, req.post_sampling_probs) if req.n_probs else None
    extra = request_extras(state.engine, logit_bias=req.logit_bias, grammar=req.grammar,
                           json_schema=req.json_schema, response_format=req.response_format, logprobs=ask)
    params = chained(chain, state, sampling(req.temperature, req.top_k, req.top_p, req.min_p, choice.seed,
                                            defaults=DEFAULTS, penalties=req, **extra))
    until = EditorRules(req).ends if req.n_indent > 0 or (req.t_max_predict_ms or 0) > 0 else None
    return Job(choice.build, params=params, max_tokens=state.budget(req.n_predict), stop=stops(req.stop),
               context_shift=state.config.context_shift, n_keep=req.n_keep, live=bool(req.stream), until=until)


def _probs(state: State, run: Run, req: CompletionRequest, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    post = run.job.params if req.post_sampling_probs else None
    return llama_probs(state.engine, lps, req.n_probs, post)


def n_choices(req: CompletionRequest) -> int:
    """`n_cmpl` (or `n`), checked with llama-server's words: llama.vscode shows the message and, when it starts
    with "Field 'n_cmpl': Value must be between", tells the user which setting to change."""
    for name in ("n_cmpl", "n"):
        v = getattr(req, name)
        if v is not None:
            if not 1 <= v <= MAX_CHOICES:
                raise ApiError(400, f"Field '{name}': Value must be between 1 <= value <= {MAX_CHOICES}, but got {v}")
            return int(v)
    return 1


async def _answer(state: State, req: CompletionRequest, request: Request, builds: list[Build]) -> Response:
    """One result per (prompt, choice): a single object for one, llama-server's array (with `index`) for more."""
    choices = plan(builds, n_choices(req), req.seed)
    first = Run(state, _job(state, req, choices[0]), request)
    await first.start()  # a client gone before the start is a 499 (app.py); a prompt too long a 400
    if req.stream:
        return StreamingResponse(_sse_all(state, req, request, choices, first), media_type="text/event-stream")
    results = []
    for i, choice in enumerate(choices):
        run = first
        if i:
            run = Run(state, _job(state, req, choice), request)
            await run.start()
        body = await _collect(state, run, req, choice.index)
        if body is None:
            return Response(status_code=499)  # the client hung up: nobody reads this
        results.append(body)
    return JSONResponse(results[0] if len(results) == 1 else results)


async def _collect(state: State, run: Run, req: CompletionRequest, index: int) -> dict[str, Any] | None:
    content, stop_type = "", "none"
    tokens: list[int] = []
    probs: list[TokenLogprob] = []
    async for piece, stop_type, ch in _policed(run, req):
        content += piece
        tokens.extend(ch.step.tokens)
        probs.extend(ch.step.logprobs)
    if run.job.cancelled.is_set() and run.last is not None and run.last.finish == "cancelled":
        return None
    body = _final(state, run, req, content, stop_type, bool(run.started and run.started.truncated), tokens, index)
    if req.n_probs:
        body["completion_probabilities"] = _probs(state, run, req, probs)
    return _project(body, req.response_fields)


class EditorRules:
    """llama-server's editor rules, round by round: `n_indent` ends the completion at a line indented less than
    the cursor; `t_max_predict_ms`, once generation has run that long, ends it at the next newline generated
    (kept: a suggestion ends with whole lines), as llama-server checks it token by token. A round's tokens
    arrive together, so a round over budget is cut after its first newline. The worker applies the rules too
    (`Job.until`), so generation stops at the cut, not a round later while the next keystroke's request waits."""

    def __init__(self, req: CompletionRequest) -> None:
        self.n_indent = req.n_indent
        self.budget = req.t_max_predict_ms or 0.0
        self.text = ""

    def push(self, ch: Chunk) -> tuple[str, str]:
        """(this round's text to send, stop_type); stop_type "none" goes on."""
        new = self.text + ch.text
        cut = indent_cut(new, self.n_indent)
        if cut is not None:
            return new[len(self.text):cut] if cut > len(self.text) else "", "limit"
        self.text = new
        nl = ch.text.find("\n")
        if self.budget > 0 and ch.stats.gen_ms > self.budget and nl >= 0:  # llama-server: "only upon a new line"
            self.text = new[:len(new) - len(ch.text) + nl + 1]
            return ch.text[:nl + 1], "limit"
        if ch.finish:
            return ch.text, ("eos" if ch.step.finish == "stop" else "word") if ch.finish == "stop" else "limit"
        return ch.text, "none"

    def ends(self, ch: Chunk) -> bool:
        return self.push(ch)[1] != "none"


async def _policed(run: Run, req: CompletionRequest) -> AsyncIterator[tuple[str, str, Chunk]]:
    """(text, stop_type, chunk) per round, with the editor rules applied."""
    rules = EditorRules(req)
    async for ch in run.chunks():
        piece, stop_type = rules.push(ch)
        yield piece, stop_type, ch
        if stop_type != "none":
            return


def generation_settings(state: State, run: Run, req: CompletionRequest) -> dict[str, Any]:
    """The sampling parameters this request actually ran with (llama-server's `generation_settings`)."""
    p = run.job.params
    d: dict[str, Any] = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)
                         if f.name not in ("constraint", "logprobs", "seed", "infill")}
    d.update(seed=-1 if p.seed is None else p.seed, n_predict=run.job.max_tokens, max_tokens=run.job.max_tokens,
             stop=list(run.job.stop), stream=req.stream, n_probs=req.n_probs, n_ctx=state.n_ctx,
             logit_bias=[[t, b] for t, b in _bias_pairs(req.logit_bias)], grammar=req.grammar or "",
             json_schema=req.json_schema, samplers=_chain_names(req.samplers),
             n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms, return_tokens=req.return_tokens,
             timings_per_token=req.timings_per_token, post_sampling_probs=req.post_sampling_probs,
             speculative={"drafter": state.engine.drafter_name, "k": spec_policy(state.engine)[0],
                          "allowed": bool(run.started and run.started.speculate)})
    return d


def _chain_names(samplers: list[str] | str | None) -> list[str]:
    """The steps this request ran (`generation_settings.samplers`): its list, or the default chain."""
    chain = parse_samplers(samplers)
    return chain.names if chain is not None else list(ORDER)


def _bias_pairs(v: Any) -> list[tuple[Any, Any]]:
    if isinstance(v, dict):
        return list(v.items())
    return [tuple(x) for x in v or [] if isinstance(x, list) and len(x) == 2]


def _prompt_text(e: Engine, tokens: tuple[int, ...]) -> str:
    """The prompt as the model saw it, special tokens written out (llama-server's `prompt`)."""
    t = e.target
    return b"".join(t.piece(i) or t.token_text(i).encode() for i in tokens).decode("utf-8", "replace")


def _final(state: State, run: Run, req: CompletionRequest, content: str, stop_type: str,
           truncated: bool, tokens: list[int], index: int = 0) -> dict[str, Any]:
    s = run.stats
    started = run.started
    return {"index": index, "content": content, "tokens": tokens if req.return_tokens else [], "id_slot": 0,
            "stop": True, "model": state.model_name, "tokens_predicted": s.n_generated,
            "tokens_evaluated": started.n_prompt_tokens if started else 0,
            "generation_settings": generation_settings(state, run, req),
            "prompt": _prompt_text(state.engine, started.prompt_tokens) if started else "",
            "tokens_cached": s.n_cached, "truncated": truncated, "has_new_line": "\n" in content,
            "stop_type": stop_type, "stopping_word": "",
            "timings": run.timings, "speculative": speculative(state, run)}


async def _sse_all(state: State, req: CompletionRequest, request: Request, choices: list[Choice],
                   first: Run) -> AsyncIterator[str]:
    """Every choice's stream in turn, each chunk with its `index`; a later choice that fails ends the stream
    with llama-server's error event."""
    for i, choice in enumerate(choices):
        run = first
        if i:
            run = Run(state, _job(state, req, choice), request)
            try:
                await run.start()
            except ClientGone:
                return
            except LocalspecError as e:
                yield _data(error_event(e))
                return
        async for event in _sse(state, run, req, choice.index):
            yield event


async def _sse(state: State, run: Run, req: CompletionRequest, index: int = 0) -> AsyncIterator[str]:
    stop_type = "none"
    n_eval = run.started.n_prompt_tokens if run.started else 0
    if req.return_progress and run.job.first is not None:
        yield _data({"index": index, "content": "", "tokens": [], "stop": False, "id_slot": 0,
                     "tokens_predicted": 0, "tokens_evaluated": n_eval, "prompt_progress": progress(run.job.first)})
    async for piece, stop_type, ch in _policed(run, req):
        if piece or (req.return_tokens and ch.step.tokens):
            d = {"index": index, "content": piece, "tokens": list(ch.step.tokens) if req.return_tokens else [],
                 "stop": False, "id_slot": 0, "tokens_predicted": run.stats.n_generated, "tokens_evaluated": n_eval}
            if req.timings_per_token:
                d["timings"] = run.timings
            if req.n_probs:
                d["completion_probabilities"] = _probs(state, run, req, ch.step.logprobs)
            yield _data(d)
    yield _data(_final(state, run, req, "", stop_type, bool(run.started and run.started.truncated), [], index))


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _project(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's `response_fields`: keep the listed paths ("timings/prompt_n"), keyed by the path."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for f in fields:
        cur: Any = body
        for part in f.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                break
            cur = cur[part]
        else:
            out[f] = cur
    return out
