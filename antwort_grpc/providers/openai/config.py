"""Where the backend is and how to talk to it, resolved once from GatewaySettings."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from antwort_grpc.config import GatewaySettings


@dataclass(frozen=True, slots=True)
class BackendConfig:
    # The base URL clients append /chat/completions to, e.g. "http://127.0.0.1:8000/v1".
    base_url: str
    # Used when a turn names no model.
    model: str = ""
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 5.0
    # The longest silence between two reads of an answer (not a bound on the whole answer).
    read_timeout: float = 120.0
    max_retries: int = 3
    # Backoff before retry n: uniform(0, min(backoff_cap, backoff_base * 2**n)).
    backoff_base: float = 0.25
    backoff_cap: float = 4.0
    # A 429 asking for a longer wait than this fails at once instead of holding the call.
    max_retry_after: float = 30.0
    # Open connections to the backend (the pool keeps them alive between requests); 0: no bound.
    # Every model call in flight holds one (HTTP/1.1), so a bound below the number of concurrent
    # conversations makes the others wait for a free connection, silently, and starves the health
    # probe: measured with 1,000 streams held open (bench/RESULTS.md).
    max_connections: int = 0

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def models_url(self) -> str:
        return self.base_url + "/models"

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> BackendConfig:
        if not settings.backend_url:
            raise ValueError("backend_url is not set")
        return cls(
            base_url=normalize_base_url(settings.backend_url),
            model=settings.model,
            api_key=read_api_key(settings),
            headers=dict(settings.backend_headers),
            connect_timeout=settings.backend_connect_timeout,
            read_timeout=settings.backend_read_timeout,
            max_retries=settings.backend_max_retries,
        )


def normalize_base_url(url: str) -> str:
    """Accepts ".../v1", ".../v1/chat/completions" or a bare "http://host:port" (meaning /v1)."""
    url = url.strip().rstrip("/")
    url = url.removesuffix("/chat/completions")
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


def read_api_key(settings: GatewaySettings) -> str | None:
    if settings.backend_api_key:
        return settings.backend_api_key
    if settings.backend_api_key_file is not None:
        # Read once at start-up; a mounted secret that rotates needs a restart.
        return settings.backend_api_key_file.read_text().strip() or None
    return None
