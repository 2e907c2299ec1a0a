"""How the gateway proves itself to its executor services, and reaches them over TLS.

`ANTWORT_EXECUTOR_TOKEN` (or `_TOKEN_FILE`) is sent as `authorization: Bearer <token>` on every
call; `ANTWORT_EXECUTOR_CA` turns TLS on (the CA that signed the services' certificates), and
`ANTWORT_EXECUTOR_CLIENT_CERT`/`_KEY` present the gateway's own certificate (mutual TLS).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from antwort_grpc.startup_errors import StartupError


def read_token(token: str | None, token_file: Path | None, setting: str) -> str | None:
    """The token from its variable or its file (one line; surrounding whitespace dropped)."""
    if token and token_file:
        raise StartupError(f"set {setting} or {setting}_FILE, not both")
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as err:
            raise StartupError(f"{setting}_FILE: {err}") from err
        if not token:
            raise StartupError(f"{setting}_FILE: {token_file} is empty")
    return token or None


def channel_credentials(
    ca: Path | None, client_cert: Path | None, client_key: Path | None
) -> grpc.ChannelCredentials | None:
    """None: plaintext. A client certificate without a CA is checked against the system's roots."""
    if (client_cert is None) != (client_key is None):
        raise StartupError("mutual TLS needs both ANTWORT_EXECUTOR_CLIENT_CERT and ANTWORT_EXECUTOR_CLIENT_KEY")
    if ca is None and client_cert is None:
        return None
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes() if ca is not None else None,
            private_key=client_key.read_bytes() if client_key is not None else None,
            certificate_chain=client_cert.read_bytes() if client_cert is not None else None,
        )
    except OSError as err:
        raise StartupError(f"ANTWORT_EXECUTOR_CA / _CLIENT_*: {err}") from err
