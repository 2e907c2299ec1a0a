"""Who is calling: the principal a credential names and the tenant it belongs to.

The authentication interceptor (grpc_security, shared with the tool programs) sets
`current_identity` for the RPC it lets through; everything below the transport reads it from there
(the store owner, per-principal limits, logs).
"""

from __future__ import annotations

from antwort_grpc.grpc_security import Authenticator, AuthError, Identity, current_identity

__all__ = ["AuthError", "Authenticator", "Identity", "current_identity", "current_owner", "current_principal"]


def current_owner() -> str:
    identity = current_identity.get()
    return identity.owner if identity is not None else ""


def current_principal() -> str:
    identity = current_identity.get()
    return identity.principal if identity is not None else ""
