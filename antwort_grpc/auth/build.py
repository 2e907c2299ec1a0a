"""The gateway's authenticator from its settings, and the rule for listening without one."""

from __future__ import annotations

from antwort_grpc.auth.apikeys import ApiKeyFile
from antwort_grpc.auth.identity import Authenticator
from antwort_grpc.auth.jwt_tokens import JwtAuthenticator, JwtSettings
from antwort_grpc.config import GatewaySettings
from antwort_grpc.grpc_security import is_loopback
from antwort_grpc.startup_errors import StartupError


def build_authenticator(settings: GatewaySettings) -> Authenticator | None:
    """Raises StartupError naming the setting to fix."""
    try:
        return _build(settings)
    except (OSError, ValueError) as err:
        setting = "ANTWORT_API_KEYS_FILE" if settings.auth == "api_key" else "ANTWORT_JWT_*"
        raise StartupError(f"{setting}: {err}") from err


def _build(settings: GatewaySettings) -> Authenticator | None:
    if settings.auth == "api_key":
        if settings.api_keys_file is None:
            raise ValueError("ANTWORT_AUTH=api_key needs this file of hashed keys")
        return ApiKeyFile(settings.api_keys_file)
    if settings.auth == "jwt":
        return JwtAuthenticator(
            settings.part(
                JwtSettings,
                "jwt_",
                keep=("required",),
                algorithms=tuple(settings.jwt_algorithms),
                leeway=settings.jwt_leeway_seconds,
                jwks_min_refresh=settings.jwt_jwks_refresh_seconds,
            )
        )
    return None


def refuse_open_listen(settings: GatewaySettings) -> None:
    """Without authentication the gateway serves anyone who reaches it, so it listens only on
    loopback unless the operator says otherwise."""
    if settings.auth != "none" or settings.allow_unauthenticated:
        return
    http = settings.http_listen if settings.http_listen not in ("", "off") else None
    for listen in (settings.listen, http):
        if listen is not None and not is_loopback(listen):
            raise StartupError(
                f"refusing to listen on {listen} without authentication: set ANTWORT_AUTH=api_key or jwt, "
                "or ANTWORT_ALLOW_UNAUTHENTICATED=true to serve every caller anyway"
            )
