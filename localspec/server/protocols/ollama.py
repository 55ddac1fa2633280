"""Ollama-compatible routes: `/api/generate` (a `suffix` makes it fill-in-the-middle), `/api/chat`, `/api/tags`,
`/api/show`, `/api/version`. Streaming is NDJSON and on by default; the final object has `done: true` and Ollama's
durations in nanoseconds, plus our `speculative` block.

`/api/show` matters to editors: Continue's Ollama provider sends fill-in-the-middle (`/api/generate` with
`suffix`) only when the model's `template` mentions `.Suffix`, so a model with FIM tokens shows Ollama's FIM
template shape, and `capabilities` says "insert". `capabilities` lists "tools" always (a template without tool
syntax gets the generic JSON format, engine/toolgrammar.py) and "thinking" where the chat template writes think
blocks, as Ollama lists them: clients that check it (the `ollama` library's users) turn tools off without it.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...engine.answer import AnswerDelta, AnswerStream, Reading, read_answer
from ...engine.chatplan import ChatPlan
from ...engine.engine import Chunk, Engine
from ..execution.run import Choices, Run, plan
from ..execution.timings import speculative
from ..execution.worker import Build, Job
from ..request.chat import chat_prompt, ollama_plan
from ..request.chat_tools import ollama_calls, ollama_message
from ..request.fim import FimTokens, has_fim, infill_build, require_fim
from ..request.sampling_fields import sampling, stops
from ..request.schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaOptions, OllamaShowRequest
from ..request.structured import request_extras
from ..state import State, StateDep

VERSION = "0.6.3"  # the Ollama API version these routes follow
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1, "repeat_last_n": 64}  # Ollama's
DONE_REASON = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def router(state: State) -> APIRouter:
    """The routes; handlers reach `state` through `StateDep` (the same object app.py passes here)."""
    r = APIRouter(tags=["Ollama"])
    r.add_api_route("/api/version", version, methods=["GET"])
    r.add_api_route("/api/tags", tags, methods=["GET"])
    r.add_api_route("/api/show", show, methods=["POST"])
    r.add_api_route("/api/generate", generate, methods=["POST"])
    r.add_api_route("/api/chat", chat, methods=["POST"])
    return r


async def version() -> dict[str, str]:
    return {"version": VERSION}


async def tags(state: StateDep) -> dict[str, Any]:
    return {"models": [_model_entry(state)]}


async def show(req: OllamaShowRequest, state: StateDep) -> dict[str, Any]:
    state.check_model(req.model or req.name)
    return show_body(state)


async def generate(req: OllamaGenerateRequest, request: Request, state: StateDep) -> Response:
    state.check_model(req.model)
    state.metrics.request("/api/generate")
    if not req.prompt and not req.suffix:  # Ollama's "load the model" request
        return JSONResponse(_head(state) | {"response": "", "done": True, "done_reason": "load"})
    return await _answer(state, req.options, req.stream, request, _generate_build(state, req), chat=False,
                         fmt=req.format)


def _generate_build(state: State, req: OllamaGenerateRequest) -> Build:
    """A `suffix` is fill-in-the-middle; `raw` (or a model without a template) sends the prompt as it is; else
    Ollama applies the model's template to the prompt (and `system`)."""
    if req.suffix:
        fim = require_fim(state.engine.metadata, state.engine.name)
        return infill_build(fim, prefix=req.prompt, suffix=req.suffix)
    if req.raw or not state.engine.chat_template:
        prompt = req.prompt
        return lambda e: (prompt, False)
    msgs = ([{"role": "system", "content": req.system}] if req.system else []) + \
        [{"role": "user", "content": req.prompt}]
    chat = ChatPlan(tuple(msgs))
    return lambda e: (chat_prompt(e, chat), False)


async def chat(req: OllamaChatRequest, request: Request, state: StateDep) -> Response:
    state.check_model(req.model)
    state.metrics.request("/api/chat")
    if not req.messages:
        return JSONResponse(_head(state) | {"message": {"role": "assistant", "content": ""}, "done": True,
                                            "done_reason": "load"})
    chat_plan = ollama_plan(state.engine, req, state.config.reasoning_format)  # bad tools: a 400 before the run
    text = chat_prompt(state.engine, chat_plan)
    return await _answer(state, req.options, req.stream, request, lambda e: (text, False), chat=True,
                         fmt=req.format, talk=Talk(chat_plan.reading(text), req.think))


def _model_entry(state: State) -> dict[str, Any]:
    e = state.engine
    p = e.target.path
    st = p.stat()
    meta = e.metadata
    arch = meta.get("general.architecture", "")
    return {"name": state.model_name, "model": state.model_name,
            "modified_at": datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat(),
            "size": st.st_size, "digest": f"{st.st_size:x}{int(st.st_mtime):x}".rjust(64, "0"),
            "details": {"format": "gguf", "family": arch, "families": [arch] if arch else [],
                        "parameter_size": meta.get("general.size_label", ""),
                        "quantization_level": p.stem.rsplit(".", 1)[-1] if "." in p.stem else "",
                        "parent_model": ""}}


def show_body(state: State) -> dict[str, Any]:
    """Ollama's /api/show for the one loaded model: the Modelfile it would have, its parameters (the
    context and these routes' sampling defaults), the template, details, the GGUF's metadata and capabilities."""
    e = state.engine
    template = ollama_template(e)
    params = {"num_ctx": state.n_ctx, **DEFAULTS}
    parameters = "\n".join(f"{k:<30} {v}" for k, v in params.items())
    modelfile = (f"# Modelfile generated by localspec\nFROM {e.target.path}\nTEMPLATE \"\"\"{template}\"\"\"\n"
                 + "".join(f"PARAMETER {k} {v}\n" for k, v in params.items()))
    entry = _model_entry(state)
    fim = has_fim(e.metadata)
    return {"modelfile": modelfile, "parameters": parameters, "template": template, "license": "",
            "details": entry["details"], "model_info": _model_info(e.metadata),
            "capabilities": capabilities(e, fim),
            "modified_at": entry["modified_at"]}


def capabilities(e: Engine, fim: bool) -> list[str]:
    """Ollama's names for what this model serves: completion and tools always, insert with FIM tokens, thinking
    where the chat template writes think blocks."""
    template = e.chat_template or ""
    thinking = "<think>" in template or "enable_thinking" in template
    return ["completion", "tools"] + ["insert"] * fim + ["thinking"] * thinking


def ollama_template(e: Engine) -> str:
    """Ollama's template shape: with FIM tokens, `{{ .Prompt }}` and `{{ .Suffix }}` between them (what
    Continue looks for); else the prompt alone (the chat template is the GGUF's Jinja one, on /props)."""
    fim = FimTokens.from_metadata(e.metadata)
    if fim is None:
        return "{{ .Prompt }}"
    t = e.target
    pre, suf, mid = (t.token_text(i) for i in (fim.pre, fim.suf, fim.mid))
    return (f"{{{{- if .Suffix }}}}{pre}{{{{ .Prompt }}}}{suf}{{{{ .Suffix }}}}{mid}"
            "{{- else }}{{ .Prompt }}{{- end }}")


def _model_info(meta: dict[str, str]) -> dict[str, Any]:
    """The GGUF's metadata as Ollama's `model_info`: numbers as numbers (llama.cpp reports every value as text)."""
    out: dict[str, Any] = {}
    for k, v in sorted(meta.items()):
        try:
            out[k] = int(v)
        except ValueError:
            try:
                x = float(v)
                out[k] = x if math.isfinite(x) else v  # "nan", "Infinity": a name, not a number (nor JSON)
            except ValueError:
                out[k] = v
    return out


def _head(state: State) -> dict[str, Any]:
    return {"model": state.model_name, "created_at": datetime.now(timezone.utc).isoformat()}


@dataclass(frozen=True)
class Talk:
    """How /api/chat reads its answer: reasoning, content and tool calls (`reading`), and the request's `think`."""

    reading: Reading = Reading()
    think: bool | str | None = None


async def _answer(state: State, options: OllamaOptions | None, stream: bool, request: Request, build: Build,
                  *, chat: bool, fmt: str | dict | None = None, talk: Talk = Talk()) -> Response:
    """One generation (Ollama has no `n`), run as every protocol runs its choices (`Choices`)."""
    o = options or OllamaOptions.model_validate({})
    t0 = time.perf_counter()
    tools = talk.reading.plan
    # in a thread: building the grammar takes seconds for a large one (execution/run.py, Choices._start)
    extra = await asyncio.to_thread(request_extras, state.engine, ollama_format=fmt,
                                    tool_grammar=tools.grammar if tools else None)
    job = Job(build, params=sampling(o.temperature, o.top_k, o.top_p, o.min_p, o.seed, defaults=DEFAULTS,
                                     penalties=o, **extra),
              max_tokens=state.budget(o.num_predict, "num_predict"), stop=stops(o.stop),
              context_shift=state.config.context_shift, live=stream)
    run = await Choices(state, request, plan([build], 1, None), lambda choice: job).start()  # gone: a 499 (app.py)
    if stream:
        return StreamingResponse(_ndjson(state, run, t0, talk if chat else None), media_type="application/x-ndjson")
    text = "".join([ch.text async for ch in run.chunks()])
    body = {"message": ollama_message(read_answer(text, talk.reading), talk.think)} if chat else {"response": text}
    return JSONResponse(_head(state) | body | _final(state, run, t0))


def _piece(state: State, text: str, chat: bool, **message: Any) -> dict[str, Any]:
    """A streamed object: `response` text, or a chat `message` with content and what else it carries."""
    body = {"message": {"role": "assistant", "content": text, **message}} if chat else {"response": text}
    return _head(state) | body


def _final(state: State, run: Run, t0: float) -> dict[str, Any]:
    s = run.stats
    ns = 1_000_000  # ms -> ns
    return {"done": True, "done_reason": DONE_REASON.get((run.last.finish if run.last else None) or "stop", "stop"),
            "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
            "prompt_eval_count": s.n_prompt, "prompt_eval_duration": int(s.prompt_ms * ns),
            "eval_count": s.n_generated, "eval_duration": int(s.gen_ms * ns),
            "speculative": speculative(state, run)}


async def _ndjson(state: State, run: Run, t0: float, talk: Talk | None) -> AsyncIterator[str]:
    """An empty piece at once and while the prompt is read, text as it comes (chat: content and thinking; a
    tool call, whole, once the answer is read), then the final object with the durations."""
    answer = AnswerStream(talk.reading) if talk else None
    nothing_yet = json.dumps(_piece(state, "", talk is not None) | {"done": False}) + "\n"
    yield nothing_yet  # at once: the prompt fits, and a client's first line need not wait for its prefill
    async for ch in run.events():
        if not isinstance(ch, Chunk):  # the prompt is still being read: an empty piece keeps the line busy
            yield nothing_yet
            continue
        if answer is None:
            if ch.text:
                yield json.dumps(_piece(state, ch.text, False) | {"done": False}) + "\n"
            continue
        piece = _chat_piece(state, answer.push(ch.text), talk)
        if piece:
            yield piece
    if answer is not None:
        piece = _chat_piece(state, answer.finish(), talk)
        if piece:
            yield piece
        if answer.calls:  # Ollama sends the calls whole, in an object of their own
            yield json.dumps(_piece(state, "", True, tool_calls=ollama_calls(answer.calls)) | {"done": False}) + "\n"
    yield json.dumps(_piece(state, "", talk is not None) | _final(state, run, t0)) + "\n"


def _chat_piece(state: State, delta: AnswerDelta, talk: Talk | None) -> str:
    """A chat object for a delta's content and thinking ("" when it adds neither: nothing is sent)."""
    thinking = delta.reasoning if talk is not None and talk.think is not False else ""
    if not (delta.content or thinking):
        return ""
    extra = {"thinking": thinking} if thinking else {}
    return json.dumps(_piece(state, delta.content, True, **extra) | {"done": False}) + "\n"
