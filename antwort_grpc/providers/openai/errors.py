"""What an HTTP failure of the backend means for the caller, and how long to wait before a retry
(pure; no I/O)."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping

from pydantic import ValidationError

from antwort_grpc.providers.base import ProviderError
from antwort_grpc.providers.openai.wire import ErrorEnvelope

# How backends say a request is longer than the model's context: OpenAI's and vLLM's code and
# message, llama.cpp's error type, Ollama's and LiteLLM's wording.
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "exceed_context_size",
    "exceeds the available context size",
    "context window",
    "too many tokens",
)

# How backends say the model reads no images: llama.cpp's server (a 500 that no retry changes),
# vLLM's and Ollama's wording.
_IMAGE_MARKERS = (
    "image input is not supported",
    "not a multimodal model",
    "does not support image",
    "does not support multimodal",
    "images are not supported",
)

# Statuses worth another try: the backend is overloaded, restarting or behind a flaky proxy.
RETRY_STATUSES = frozenset({408, 500, 502, 503, 504})


def backend_message(body: bytes) -> str:
    """The human part of an error body, whatever shape the backend gave it."""
    try:
        envelope = ErrorEnvelope.model_validate_json(body)
    except ValidationError:
        return body[:300].decode("utf-8", "replace").strip()
    error = envelope.error
    if error is not None and not isinstance(error, str):
        return error.message
    return error or envelope.detail or envelope.message or ""


def status_error(status: int, body: bytes, *, model: str, url: str) -> ProviderError:
    """The error for a non-2xx answer. `retryable` says whether another try may help."""
    detail = backend_message(body) or f"HTTP {status}"
    if status in (400, 413) and _context_too_long(body):
        return ProviderError(
            "context_length_exceeded", f"the conversation is longer than the model's context: {detail}"
        )
    if status in (401, 403):
        return ProviderError(
            "backend_auth",
            f"the model backend at {url} rejected the gateway's credentials (HTTP {status}: {detail}); "
            "check ANTWORT_BACKEND_API_KEY or ANTWORT_BACKEND_API_KEY_FILE",
        )
    if status == 404:
        return ProviderError("model_not_found", f"the model backend at {url} does not serve model {model!r} ({detail})")
    if status in (400, 422, 500) and _marked(body, _IMAGE_MARKERS):
        return ProviderError(
            "image_unsupported", f"the model reads no images, and the request's input holds one: {detail}"
        )
    if status == 429:
        return ProviderError("rate_limited", f"the model backend is rate limiting: {detail}", retryable=True)
    if status in RETRY_STATUSES:
        return ProviderError(
            "backend_unavailable", f"the model backend answered HTTP {status}: {detail}", retryable=True
        )
    if status >= 500:
        return ProviderError("backend_unavailable", f"the model backend answered HTTP {status}: {detail}")
    return ProviderError("invalid_request", f"the model backend refused the request (HTTP {status}): {detail}")


# How backends word a refusal of response_format (or of the grammar they would build from it).
_FORMAT_MARKERS = ("response_format", "json_schema", "json schema", "json_object", "grammar", "structured output")


def structured_refusal(failure: ProviderError) -> ProviderError:
    """A refusal of a request that asked for structured output, naming the parameter: the code
    text_format_unsupported when the backend's words are about it, else the same error with a
    note that the request asked for it."""
    if failure.code != "invalid_request":
        return failure
    if any(marker in failure.message.lower() for marker in _FORMAT_MARKERS):
        return ProviderError(
            "text_format_unsupported",
            f"the model backend refused response_format, which carries the request's text.format: {failure.message}",
        )
    note = " (the request asks for structured output: text.format, sent as response_format)"
    return ProviderError(failure.code, failure.message + note)


def _context_too_long(body: bytes) -> bool:
    return _marked(body, _CONTEXT_MARKERS)


def _marked(body: bytes, markers: tuple[str, ...]) -> bool:
    text = body[:2000].decode("utf-8", "replace").lower()
    return any(marker in text for marker in markers)


def retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the backend asked us to wait: retry-after-ms (OpenAI), Retry-After as seconds
    or as an HTTP date."""
    if (millis := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Full-jitter exponential backoff: many gateways retrying at once spread out."""
    return random.uniform(0, min(cap, base * 2**attempt))
