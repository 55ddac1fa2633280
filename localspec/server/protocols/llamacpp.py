"""llama-server's routes: `/infill` (what llama.vim and llama.vscode call), `/completion`, `/health`, `/props`,
`/slots`, `/tokenize`, `/detokenize`, `/apply-template`.

Responses use llama-server's field names (`content`, `stop`, `tokens_cached`, `timings{...}`) so editor plugins
read them unchanged; `timings` also carries `draft_n`/`draft_n_accepted`, and `speculative` says whether
speculation ran for this request. Streaming is SSE: `data: {...}` lines, the last one with `stop: true`
(completion.py writes the answers). Like llama-server, these routes ignore `model`: there is one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ... import __version__
from ...backend import llama_build
from ...engine.engine import Engine
from ..execution.timings import spec_policy
from ..http import ApiError
from ..request.chat import chat_prompt, openai_plan
from ..request.fim import Extra, has_fim, infill_build, require_fim
from ..request.prompts import check_ids, checked_prompts, mixed_tokens, plain_build
from ..request.schemas import CompletionRequest, DetokenizeRequest, InfillRequest, OAIChatRequest, TokenizeRequest
from ..state import State, StateDep
from .completion import DEFAULTS, Completion


def router(state: State) -> APIRouter:
    """The routes; handlers reach `state` through `StateDep` (the same object app.py passes here)."""
    r = APIRouter(tags=["llama.cpp"])
    r.add_api_route("/health", health, methods=["GET"])
    r.add_api_route("/v1/health", health, methods=["GET"], include_in_schema=False)
    r.add_api_route("/props", props, methods=["GET"])
    r.add_api_route("/slots", slots, methods=["GET"])
    r.add_api_route("/completion", completion, methods=["POST"])
    r.add_api_route("/completions", completion, methods=["POST"], include_in_schema=False)
    r.add_api_route("/infill", infill, methods=["POST"])
    r.add_api_route("/tokenize", tokenize, methods=["POST"])
    r.add_api_route("/detokenize", detokenize, methods=["POST"])
    r.add_api_route("/apply-template", apply_template, methods=["POST"])
    r.add_api_route("/v1/chat/completions/input_tokens", chat_input_tokens, methods=["POST"])
    r.add_api_route("/chat/completions/input_tokens", chat_input_tokens, methods=["POST"], include_in_schema=False)
    return r


async def health(state: StateDep) -> Response:
    if not state.worker.alive():
        return JSONResponse({"error": {"code": 503, "message": "generation worker is not running",
                                       "type": "unavailable_error"}}, status_code=503)
    return JSONResponse({"status": "ok"})


async def props(state: StateDep) -> dict[str, Any]:
    """llama-server's fields (one slot: the one generation worker), then ours (`drafter`, `k`, `fim`...)."""
    e, t = state.engine, state.engine.target
    return {"default_generation_settings": default_settings(state), "total_slots": 1,
            "model_alias": state.model_name, "model_path": str(t.path),
            "modalities": {"vision": False, "audio": False},
            "endpoint_slots": state.config.slots, "endpoint_props": False, "endpoint_metrics": True, "webui": False,
            "chat_template": e.chat_template or "",
            "bos_token": t.token_text(t.bos) if t.bos >= 0 else "",
            "eos_token": t.token_text(t.eos) if t.eos >= 0 else "",
            "build_info": llama_build(), "localspec_version": __version__, "is_sleeping": False,
            "model": state.model_name, "n_ctx": state.n_ctx, "drafter": e.drafter_name, "k": spec_policy(e)[0],
            "fim": has_fim(e.metadata), "spec_max_queue": state.config.spec_max_queue, "devices": devices_in_use(e)}


async def slots(request: Request, state: StateDep) -> list[dict[str, Any]]:
    """llama-server's /slots: one slot, the one generation worker, busy while a job runs (its task id, prompt
    and tokens so far, as llama-server's `next_token`). `--no-slots` turns it off (501, as there);
    `?fail_on_no_slot=1` is a 503 while the worker is busy."""
    if not state.config.slots:
        raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`",
                       "not_supported_error")
    job = state.worker.current
    if job is not None and request.query_params.get("fail_on_no_slot"):
        raise ApiError(503, "no slot available", "unavailable_error")
    slot: dict[str, Any] = {"id": 0, "n_ctx": state.n_ctx, "speculative": state.engine.drafter is not None,
                            "is_processing": job is not None}
    if job is not None:
        slot.update(id_task=job.id, n_prompt_tokens=job.n_prompt_tokens,
                    next_token=[{"has_next_token": True, "has_new_line": False,
                                 "n_remain": job.max_tokens - job.n_decoded, "n_decoded": job.n_decoded}])
    return [slot]


async def completion(req: CompletionRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/completion")
    prompts = checked_prompts(req.prompt, state.engine.target.n_vocab)
    return await Completion(state, req, request, [plain_build(p) for p in prompts]).answer()


async def infill(req: InfillRequest, request: Request, state: StateDep) -> Response:
    state.metrics.request("/infill")
    fim = require_fim(state.engine.metadata, state.engine.name)
    build = infill_build(fim, prefix=req.input_prefix, suffix=req.input_suffix, prompt=_cursor(req.prompt),
                         extra=[Extra(c.text, c.filename) for c in req.input_extra],
                         n_predict=req.n_predict if req.n_predict and req.n_predict > 0 else 0)
    return await Completion(state, req, request, [build]).answer()


async def tokenize(req: TokenizeRequest, state: StateDep) -> dict[str, Any]:
    """Outside the generation worker, as llama-server too tokenizes outside its generation loop: the vocabulary
    is read-only (worker.py says why that is safe). In a thread, not on the event loop: 5 MB of text takes
    seconds, and /health and every stream would wait for it."""
    return await asyncio.to_thread(_tokenize, req, state)


def _tokenize(req: TokenizeRequest, state: State) -> dict[str, Any]:
    t = state.engine.target
    if isinstance(req.content, list):  # llama-server's mixed form: ids kept, text pieces tokenized
        check_ids(req.content, t.n_vocab, "token ids")
        toks = mixed_tokens(state.engine, req.content, add_special=req.add_special, parse_special=req.parse_special)
    else:
        toks = t.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
    if not req.with_pieces:
        return {"tokens": toks}
    return {"tokens": [{"id": i, "piece": _piece(t.piece(i))} for i in toks]}


async def detokenize(req: DetokenizeRequest, state: StateDep) -> dict[str, str]:
    return await asyncio.to_thread(_detokenize, req, state)


def _detokenize(req: DetokenizeRequest, state: State) -> dict[str, str]:
    t = state.engine.target
    bad = [i for i in req.tokens if not 0 <= i < t.n_vocab]
    if bad:
        raise ApiError(400, f"token ids must be in [0, {t.n_vocab}), got {bad[0]}")
    return {"content": t.detokenize(req.tokens)}


def chat_request_prompt(state: State, req: OAIChatRequest) -> str:
    """The prompt `/v1/chat/completions` would evaluate for `req`: its tools and template variables included."""
    return chat_prompt(state.engine, openai_plan(state.engine, req, state.config.reasoning_format))


async def apply_template(req: OAIChatRequest, state: StateDep) -> dict[str, str]:
    return {"prompt": chat_request_prompt(state, req)}


async def chat_input_tokens(req: OAIChatRequest, state: StateDep) -> dict[str, Any]:
    """The prompt tokens a chat request would evaluate (its template applied), without generating."""
    n = len(state.engine.tokenize(chat_request_prompt(state, req)))
    return {"object": "response.input_tokens", "input_tokens": n}


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
    from ...backend import devices

    used = set(e.target.offload_devices)
    return [{**d, "target": d["name"] in used} for d in devices()]


def _piece(b: bytes) -> str | list[int]:
    """llama-server's `with_pieces`: the text when it is valid UTF-8, else the byte values."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _cursor(prompt: object) -> str:
    if not isinstance(prompt, str):
        raise ApiError(400, "/infill takes `prompt` as text (the part of the current line before the cursor)")
    return prompt
