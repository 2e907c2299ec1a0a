"""Who is calling: the principal a credential names and the tenant it belongs to.

The gateway's authentication interceptor sets `current_identity` for the RPC it lets through;
everything below the transport reads it from there (the store owner, per-principal limits, logs).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Identity:
    principal: str
    tenant: str = ""

    @property
    def owner(self) -> str:
        """The owner recorded on stored responses: the tenant when the credential names one (every
        principal of a tenant sees the tenant's responses), else the principal alone. Prefixed so a
        tenant and a principal of the same name never share responses."""
        return f"tenant:{self.tenant}" if self.tenant else f"principal:{self.principal}"


class AuthError(Exception):
    """A credential is missing, malformed, expired or unknown; the message says which, never
    echoing the credential."""


class Authenticator(Protocol):
    """API keys or JWTs: the Identity a credential names, AuthError when it names none."""

    async def authenticate(self, credential: str) -> Identity: ...


# None: no authentication configured (ANTWORT_AUTH=none), or outside an RPC.
current_identity: ContextVar[Identity | None] = ContextVar("current_identity", default=None)


def current_owner() -> str:
    identity = current_identity.get()
    return identity.owner if identity is not None else ""


def current_principal() -> str:
    identity = current_identity.get()
    return identity.principal if identity is not None else ""
