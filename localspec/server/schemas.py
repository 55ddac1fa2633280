"""Request bodies of the three protocols, as pydantic models: FastAPI validates them (wrong types become a 400
with a JSON body, never a 500) and publishes them in /openapi.json, which the schemathesis run fuzzes.

Unknown fields are accepted and ignored (`extra="allow"`): clients send many options we do not use
(llama.vim's `samplers`, `id_slot`; OpenAI's `user`; Ollama's `keep_alive`); docs/server.md lists which.
Limits that depend on the loaded model (context size) are checked in the routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TOKENS = 1 << 20  # anything above is rejected here; the routes check against n_ctx


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


Stop = str | list[str] | None


LogitBias = dict[str, float | bool] | list[list[Any]] | None
Schema = dict[str, Any] | None


class Sampling(_Body):
    temperature: float | None = Field(None, ge=0, le=100)
    top_k: int | None = Field(None, ge=0, le=1 << 20)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-1, le=2**63 - 1)
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    repeat_last_n: int | None = Field(None, ge=-1, le=1 << 20)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: LogitBias = None
    grammar: str | None = None  # GBNF (llama.cpp)
    json_schema: Schema = None  # llama.cpp
    response_format: Schema = None  # OpenAI: {"type": "json_object" | "json_schema" | "text", ...}


# -- llama.cpp --------------------------------------------------------------------------------------------------

class CompletionRequest(Sampling):
    prompt: str | list[int] = ""
    n_predict: int = Field(-1, ge=-1, le=MAX_TOKENS, description="-1 = until the context or --max-predict")
    stop: Stop = None
    stream: bool = False
    cache_prompt: bool = True
    t_max_predict_ms: float | None = Field(None, ge=0)
    t_max_prompt_ms: float | None = None
    n_indent: int = Field(0, ge=0, le=1 << 16)
    response_fields: list[str] | None = None
    model: str | None = None
    return_tokens: bool = False
    n_probs: int = Field(0, ge=0, le=1024, description="top tokens' logprobs per generated token (0 = off)")
    post_sampling_probs: bool = False


class ExtraChunk(_Body):
    """llama-server's rule: `text` must be a string, `filename` (optional) too; anything else is a 400."""

    text: str = Field(strict=True)
    filename: str = Field("tmp", strict=True)


class InfillRequest(CompletionRequest):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)


# -- OpenAI -----------------------------------------------------------------------------------------------------

class StreamOptions(_Body):
    include_usage: bool = False


class OAICompletionRequest(Sampling):
    model: str | None = None
    prompt: str | list[str] = ""
    suffix: str | None = None
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, description="only 1: one choice per request")
    logprobs: int | None = Field(None, ge=0, le=1024, description="top tokens' logprobs per token (legacy)")


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = ""


class OAIChatRequest(Sampling):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, description="only 1: one choice per request")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=1024)


# -- Ollama -----------------------------------------------------------------------------------------------------

class OllamaOptions(_Body):
    temperature: float | None = Field(None, ge=0, le=100)
    top_k: int | None = Field(None, ge=0, le=1 << 20)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-1, le=2**63 - 1)
    num_predict: int | None = Field(None, ge=-2, le=MAX_TOKENS, description="-1 = unlimited, -2 = fill context")
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    repeat_last_n: int | None = Field(None, ge=-1, le=1 << 20)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stop: list[str] | None = None


class OllamaGenerateRequest(_Body):
    model: str = ""
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    raw: bool = False
    stream: bool = True
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema


class TokenizeRequest(_Body):
    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int] = Field(default_factory=list)


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""


class OllamaChatRequest(_Body):
    model: str = ""
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: bool = True
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None
