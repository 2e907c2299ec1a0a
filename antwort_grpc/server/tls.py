"""TLS for the gateway's gRPC port, from PEM files."""

from __future__ import annotations

from pathlib import Path

import grpc

from antwort_grpc.startup_errors import StartupError


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None, *, setting: str = "ANTWORT_TLS"
) -> grpc.ServerCredentials | None:
    """None: plaintext. With `client_ca`, callers must present a certificate it signed (mTLS).
    `setting`: the variables' prefix, named in errors."""
    if cert is None and key is None:
        if client_ca is not None:
            raise StartupError(f"{setting}_CLIENT_CA needs {setting}_CERT and {setting}_KEY")
        return None
    if cert is None or key is None:
        raise StartupError(f"TLS needs both {setting}_CERT and {setting}_KEY")
    try:
        return grpc.ssl_server_credentials(
            [(key.read_bytes(), cert.read_bytes())],
            root_certificates=client_ca.read_bytes() if client_ca is not None else None,
            require_client_auth=client_ca is not None,
        )
    except OSError as err:
        raise StartupError(f"{setting}_*: {err}") from err
