"""The JSON wire format of /v1/chat/completions responses, as far as the provider reads it.

Only the fields we use are declared; everything else a backend adds (logprobs, timings,
system_fingerprint, …) is ignored. Fields that some backends send as null are optional.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionFragment(_Wire):
    name: str | None = None
    arguments: str | None = None


class ToolCallFragment(_Wire):
    # Ollama has been seen to omit the index; the translator then keys calls by id.
    index: int | None = None
    id: str | None = None
    function: FunctionFragment | None = None


class _Said(_Wire):
    """What an assistant message says; a streamed delta carries a fragment of each field."""

    role: str | None = None
    content: str | None = None
    # vLLM and DeepSeek say reasoning_content; Ollama and newer vLLM say reasoning.
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None


class Delta(_Said):
    tool_calls: list[ToolCallFragment] | None = None


class TopLogprob(_Wire):
    token: str = ""
    logprob: float = 0.0
    bytes: list[int] | None = None


class TokenLogprob(_Wire):
    token: str = ""
    logprob: float = 0.0
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] | None = None


class ChoiceLogprobs(_Wire):
    content: list[TokenLogprob] | None = None


class ChunkChoice(_Wire):
    index: int = 0
    delta: Delta | None = None
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class PromptDetails(_Wire):
    cached_tokens: int | None = None


class CompletionDetails(_Wire):
    reasoning_tokens: int | None = None


class Usage(_Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int | None = None
    # OpenAI's and vLLM's breakdowns (null or absent where the backend does not report them).
    prompt_tokens_details: PromptDetails | None = None
    completion_tokens_details: CompletionDetails | None = None


class ErrorBody(_Wire):
    message: str = ""
    type: str | None = None
    code: str | int | None = None


class ChatCompletionChunk(_Wire):
    choices: list[ChunkChoice] = []
    usage: Usage | None = None
    # Some backends (vLLM, LiteLLM) report a failure inside the stream.
    error: ErrorBody | None = None


class FunctionCall(_Wire):
    name: str = ""
    arguments: str = ""


class ToolCall(_Wire):
    id: str | None = None
    function: FunctionCall


class Message(_Said):
    tool_calls: list[ToolCall] | None = None


class Choice(_Wire):
    index: int = 0
    message: Message
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(_Wire):
    choices: list[Choice]
    usage: Usage | None = None


class ErrorEnvelope(_Wire):
    error: ErrorBody | str | None = None
    # Some servers answer {"detail": "..."} (FastAPI) or {"message": "..."}.
    detail: str | None = None
    message: str | None = None
