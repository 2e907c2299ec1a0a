"""The provider for OpenAI-compatible /v1/chat/completions backends."""

from antwort_grpc.providers.openai.config import BackendConfig
from antwort_grpc.providers.openai.provider import OpenAICompatProvider

__all__ = ["BackendConfig", "OpenAICompatProvider"]
