"""Who may call an executor service: a shared token and/or TLS with client certificates.

Executor services run code and reach MCP servers for the gateway; nothing else should be able to
call them. With `ANTWORT_EXECUTOR_TOKEN` (or `_TOKEN_FILE`) every RPC but the health service needs
`authorization: Bearer <token>`, compared in constant time, else `UNAUTHENTICATED`. With
`ANTWORT_EXECUTOR_TLS_CERT`/`_KEY` the port speaks TLS; with `_TLS_CLIENT_CA` too, a caller must
present a certificate that CA signed (mutual TLS). Without either the service accepts any caller,
so it listens only on loopback, unless `--allow-unauthenticated`
(`ANTWORT_EXECUTOR_ALLOW_UNAUTHENTICATED=true`) says a network policy guards it instead.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

import grpc

from antwort_grpc.executors.credentials import read_token
from antwort_grpc.grpc_security import AuthError, AuthInterceptor, Identity, is_loopback, server_credentials
from antwort_grpc.startup_errors import StartupError

GATEWAY = Identity("gateway")


class SharedToken:
    """The Authenticator of a shared secret."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def authenticate(self, credential: str) -> Identity:
        if not hmac.compare_digest(credential.encode(), self._token):
            raise AuthError("the executor token is not the one this service expects")
        return GATEWAY


@dataclass(frozen=True)
class ExecutorSecurity:
    token: str | None = None
    credentials: grpc.ServerCredentials | None = None
    mutual_tls: bool = False
    # Serve a non-loopback address without a token or mutual TLS anyway (a network policy guards it).
    allow_unauthenticated: bool = False

    @property
    def admits_only_the_gateway(self) -> bool:
        """A token or a client certificate is needed; TLS alone only hides the traffic."""
        return bool(self.token) or self.mutual_tls

    def refuse_open_listen(self, listen: str) -> None:
        """An executor runs code and reaches MCP servers for whoever calls it: without a token or
        mutual TLS it listens only where nobody but this machine reaches it, unless told otherwise."""
        if self.admits_only_the_gateway or self.allow_unauthenticated or is_loopback(listen):
            return
        raise StartupError(
            f"refusing to listen on {listen} without a token or mutual TLS: set --token-file / "
            "ANTWORT_EXECUTOR_TOKEN(_FILE), or --tls-cert, --tls-key and --tls-client-ca / "
            "ANTWORT_EXECUTOR_TLS_CERT, _KEY and ANTWORT_EXECUTOR_TLS_CLIENT_CA, or --allow-unauthenticated / "
            "ANTWORT_EXECUTOR_ALLOW_UNAUTHENTICATED=true to serve every caller anyway"
        )

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [AuthInterceptor(SharedToken(self.token))] if self.token else []

    def describe(self) -> str:
        transport = "mutual TLS" if self.mutual_tls else "TLS" if self.credentials else "plaintext"
        return f"{transport}, {'token required' if self.token else 'no token'}"


def executor_security(
    token: str | None,
    token_file: Path | None,
    cert: Path | None,
    key: Path | None,
    client_ca: Path | None,
    *,
    allow_unauthenticated: bool = False,
) -> ExecutorSecurity:
    credentials = server_credentials(cert, key, client_ca, setting="ANTWORT_EXECUTOR_TLS")
    return ExecutorSecurity(
        read_token(token, token_file, "ANTWORT_EXECUTOR_TOKEN"),
        credentials,
        mutual_tls=client_ca is not None,
        allow_unauthenticated=allow_unauthenticated,
    )
