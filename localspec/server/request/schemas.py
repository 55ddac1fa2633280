"""Request bodies of the three protocols, as pydantic models: FastAPI validates them (wrong types become a 400
with a JSON body, never a 500) and publishes them in /openapi.json, which the schemathesis run fuzzes.

Unknown fields are accepted and ignored (`extra="allow"`): clients send many options we do not use
(llama.vim's `id_slot`; OpenAI's `user`; Ollama's `keep_alive`); docs/server.md lists which.
Limits that depend on the loaded model (context size) are checked in the routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TOKENS = 1 << 20  # anything above is rejected here; the routes check against n_ctx
MAX_CHOICES = 16  # n / n_cmpl: choices per prompt (each one is a full generation on the one worker)
MAX_PROMPTS = 32  # prompts in one request (a list of prompts)
MAX_RESULTS = 32  # prompts x choices: each is a generation the one worker runs in turn


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


Stop = str | list[str] | None
# llama-server's prompt forms: text, token ids, a mixed list of both (one prompt), or a list of those (several)
Piece = int | str
Prompt = str | dict[str, Any] | list[Piece | list[Piece] | dict[str, Any]]  # a dict: {"prompt_string": ...}


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
    samplers: list[str] | str | None = Field(None, description="llama.cpp's chain: the steps that run, in order "
                                             "(names, or letters such as \"kpi\"); absent = the default chain")


# -- llama.cpp --------------------------------------------------------------------------------------------------

class Streaming(_Body):
    """llama-server's per-request stream extras, on every llama.cpp and OpenAI route."""

    timings_per_token: bool = False  # a `timings` block on every streamed chunk
    return_progress: bool = False  # a `prompt_progress` event once the prompt is evaluated
    post_sampling_probs: bool = False  # probabilities after the sampling chain (`prob`, `top_probs`)


class CompletionRequest(Sampling, Streaming):
    prompt: Prompt = ""
    n_predict: int | None = Field(None, ge=-1, le=MAX_TOKENS,
                                  description="-1 = until the context or --max-predict; absent = the server's -n")
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
    # checked in the route, with llama-server's message (llama.vscode shows it and adds a hint when it matches)
    n_cmpl: int | None = Field(None, description=f"completions per prompt, 1..{MAX_CHOICES} (default: n, 1)")
    n_keep: int = Field(0, ge=-1, le=MAX_TOKENS, description="tokens a context shift keeps (-1: the prompt)")
    n: int | None = Field(None, description="n_cmpl's other name")


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


class OAICompletionRequest(Sampling, Streaming):
    model: str | None = None
    prompt: Prompt = ""
    suffix: str | None = None
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices per prompt, generated one after another")
    logprobs: int | None = Field(None, ge=0, le=1024, description="top tokens' logprobs per token (legacy)")


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = ""
    tool_calls: list[dict[str, Any]] | None = None  # the assistant's calls, arguments as JSON text
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool or legacy `function` result: the function's name
    function_call: dict[str, Any] | None = None  # the legacy form of one call
    reasoning_content: str | None = None  # an earlier answer's reasoning (templates such as Qwen 3's render it)


ToolChoice = Literal["auto", "none", "required"] | dict[str, Any] | None


class OAIChatRequest(Sampling, Streaming):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices, generated one after another")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=1024)
    add_generation_prompt: bool | None = Field(None, description="end the prompt with the assistant's turn opening "
                                               "(default: true unless a final assistant message is continued)")
    continue_final_message: bool | None = Field(None, description="a trailing assistant message is continued "
                                                "(the default when the last message is the assistant's)")
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool = True
    functions: list[dict[str, Any]] | None = Field(None, description="the legacy form of `tools`")
    function_call: Literal["auto", "none"] | dict[str, Any] | None = Field(None, description="legacy tool_choice")
    reasoning_format: Literal["auto", "none", "deepseek"] | None = Field(
        None, description="where <think> text goes (llama-server's per-request --reasoning-format)")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="more variables for the chat template "
                                                        "(e.g. enable_thinking)")


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


class OllamaShowRequest(_Body):
    model: str = ""
    name: str = ""  # the older field (Continue sends it)
    verbose: bool = False


class TokenizeRequest(_Body):
    content: str | list[Piece] = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int] = Field(default_factory=list)


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    tool_calls: list[dict[str, Any]] | None = None  # {"function": {"name": ..., "arguments": {...}}}
    tool_name: str | None = None  # a tool result: the function that gave it
    thinking: str | None = None  # an earlier answer's reasoning (the template reads it as reasoning_content)


class OllamaChatRequest(_Body):
    model: str = ""
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: bool = True
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    think: bool | Literal["low", "medium", "high"] | None = None  # None: as the model does by itself
