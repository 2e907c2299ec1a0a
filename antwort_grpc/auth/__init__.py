"""Authentication and tenancy of the gateway: API keys or JWTs → an Identity per RPC."""

from antwort_grpc.auth.identity import AuthError, Identity, current_identity, current_owner, current_principal

__all__ = ["AuthError", "Identity", "current_identity", "current_owner", "current_principal"]
