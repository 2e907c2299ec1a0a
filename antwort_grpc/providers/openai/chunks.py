"""The chunks of a streamed answer, decoded: one per backend delta, so the decoder runs once per
token. msgspec decodes a chunk in about a sixth of the time of the pydantic model in wire.py
(0.7 µs against 4.3 on the development VM; measured by scripts/measure_chunk_decoders.py).

The two accept the same chunks and say the same about one they cannot use: msgspec is stricter
(an index of 1.0 or "1", an integer past 64 bits, are not ints to it), so a chunk it refuses
goes to the pydantic model, which decides — what it accepts is used, its error is the one
reported. A chunk msgspec accepts, pydantic accepts with the same values
(tests/providers/test_chunk_decoding.py checks that on generated chunks).
"""

from __future__ import annotations

import msgspec
from pydantic import ValidationError

from antwort_grpc.providers import base
from antwort_grpc.providers.openai import wire


# Each one frozen, with the field names and defaults of its pydantic twin in wire.py.
class FunctionFragment(msgspec.Struct, frozen=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallFragment(msgspec.Struct, frozen=True):
    index: int | None = None
    id: str | None = None
    function: FunctionFragment | None = None


class Delta(msgspec.Struct, frozen=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallFragment] | None = None


class TopLogprob(msgspec.Struct, frozen=True):
    token: str = ""
    logprob: float = 0.0
    bytes: list[int] | None = None


class TokenLogprob(msgspec.Struct, frozen=True):
    token: str = ""
    logprob: float = 0.0
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] | None = None


class ChoiceLogprobs(msgspec.Struct, frozen=True):
    content: list[TokenLogprob] | None = None


class ChunkChoice(msgspec.Struct, frozen=True):
    index: int = 0
    delta: Delta | None = None
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class PromptDetails(msgspec.Struct, frozen=True):
    cached_tokens: int | None = None


class CompletionDetails(msgspec.Struct, frozen=True):
    reasoning_tokens: int | None = None


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int | None = None
    # OpenAI's and vLLM's breakdowns (null or absent where the backend does not report them).
    prompt_tokens_details: PromptDetails | None = None
    completion_tokens_details: CompletionDetails | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    message: str = ""
    type: str | None = None
    code: str | int | None = None


class ChatCompletionChunk(msgspec.Struct, frozen=True):
    choices: list[ChunkChoice] = []
    usage: Usage | None = None
    error: ErrorBody | None = None


Chunk = ChatCompletionChunk | wire.ChatCompletionChunk
AnyUsage = Usage | wire.Usage
AnyErrorBody = ErrorBody | wire.ErrorBody
AnyToolCallFragment = ToolCallFragment | wire.ToolCallFragment
AnyLogprobs = ChoiceLogprobs | wire.ChoiceLogprobs

_decoder = msgspec.json.Decoder(ChatCompletionChunk)


def decode_chunk(data: bytes) -> Chunk:
    """The chunk `data` holds; ProviderError backend_protocol_error (the pydantic model's reason)
    when it is not one."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:  # msgspec.ValidationError is one too
        pass
    try:
        return wire.ChatCompletionChunk.model_validate_json(data)
    except ValidationError as error:
        raise protocol_error(data, error) from None


def protocol_error(data: bytes, error: ValidationError) -> base.ProviderError:
    sample = data[:120].decode("utf-8", "replace")
    reason = error.errors()[0]["msg"] if error.errors() else str(error)
    return base.ProviderError("backend_protocol_error", f"the model backend sent malformed data ({reason}): {sample!r}")
