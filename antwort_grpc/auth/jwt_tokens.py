"""JWT bearer tokens (PyJWT): signature by a key from a JWKS (file or URL) or a PEM public key;
issuer, audience and expiry checked; principal and tenant taken from configurable claims.

Only asymmetric algorithms are accepted (the gateway holds public keys, never a shared secret),
and the algorithm list is ours, not the token's: a token cannot pick `none` or HS256.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from antwort_grpc.auth.identity import AuthError, Identity

log = logging.getLogger(__name__)

ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})
JWKS_TIMEOUT = 5.0
# The algorithms each kind of key checks (an EC key: the one of its curve, below). PyJWT trusts
# the token's `alg` to pick the check and fails with a TypeError when the key is of another kind
# (RS256 naming an EC key), with an InvalidKeyError when the curve is another.
KEY_ALGORITHMS: tuple[tuple[tuple[type, ...], frozenset[str]], ...] = (
    ((rsa.RSAPublicKey, rsa.RSAPrivateKey), frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})),
    (
        (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey, ed448.Ed448PublicKey, ed448.Ed448PrivateKey),
        frozenset({"EdDSA"}),
    ),
)


@dataclass(frozen=True, slots=True)
class JwtSettings:
    issuer: str
    audience: str
    algorithms: Sequence[str] = ("RS256", "ES256")
    # Dotted paths into the claims ("sub", "org.id").
    principal_claim: str = "sub"
    tenant_claim: str = "tenant"
    leeway: float = 30.0
    # Exactly one of these.
    jwks: str = ""  # a file path or an http(s):// URL
    public_key_file: Path | None = None
    # Fetching a JWKS URL again for an unknown key id happens at most this often (a flood of tokens
    # with made-up key ids must not become a flood of requests to the identity provider).
    jwks_min_refresh: float = 30.0
    required: Sequence[str] = field(default=("exp", "iss", "aud"))


# An EC key checks the one algorithm of its curve.
CURVE_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


def algorithms_for(key: Any, allowed: Sequence[str]) -> list[str]:
    """The configured algorithms this key can check (none for a symmetric or unknown key)."""
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        algorithm = CURVE_ALGORITHMS.get(key.curve.name, "")
        return [algorithm] if algorithm in allowed else []
    for kinds, algorithms in KEY_ALGORITHMS:
        if isinstance(key, kinds):
            return [a for a in allowed if a in algorithms]
    return []


def claim(claims: Mapping[str, Any], path: str) -> str:
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return ""
        value = value[part]
    return value if isinstance(value, str) else str(value) if isinstance(value, int) else ""


class _Keys:
    """Signing keys by key id, from a JWKS file (read again when it changes) or URL (fetched
    again, rate-limited, when a token names a key id not seen yet), or one PEM key."""

    def __init__(self, settings: JwtSettings) -> None:
        self.source = settings.jwks
        self.min_refresh = settings.jwks_min_refresh
        self.by_kid: dict[str, Any] = {}
        self.single: Any = None
        self._file_mtime = -1
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        if settings.public_key_file is not None:
            self.single = load_pem_public_key(settings.public_key_file.read_bytes())
        elif not self.source:
            raise ValueError("JWT authentication needs ANTWORT_JWT_JWKS or ANTWORT_JWT_PUBLIC_KEY_FILE")
        elif not self._is_url:
            self._read_file()

    @property
    def _is_url(self) -> bool:
        return self.source.startswith(("http://", "https://"))

    def _load(self, document: str) -> None:
        keys: dict[str, Any] = {}
        for jwk in jwt.PyJWKSet.from_json(document).keys:
            keys[jwk.key_id or ""] = jwk.key
        self.by_kid = keys

    def _read_file(self) -> None:
        path = Path(self.source)
        mtime = path.stat().st_mtime_ns
        if mtime != self._file_mtime:
            self._load(path.read_text())
            self._file_mtime = mtime

    async def _fetch(self) -> None:
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._fetched_at is not None and loop.time() - self._fetched_at < self.min_refresh:
                return
            self._fetched_at = loop.time()
            try:
                timeout = aiohttp.ClientTimeout(total=JWKS_TIMEOUT)
                async with (
                    aiohttp.ClientSession(timeout=timeout, trust_env=False) as session,
                    session.get(self.source) as reply,
                ):
                    reply.raise_for_status()
                    self._load(await reply.text())
            except (aiohttp.ClientError, TimeoutError, jwt.PyJWKSetError, json.JSONDecodeError) as err:
                log.warning("fetching the JWKS at %s failed: %r", self.source, err)

    async def key(self, kid: str) -> Any:
        if self.single is not None:
            return self.single
        if not self._is_url:
            try:
                self._read_file()
            except (OSError, jwt.PyJWKSetError, json.JSONDecodeError) as err:
                log.error("JWKS file %s cannot be read (%r); keeping the keys loaded before", self.source, err)
        elif kid not in self.by_kid:
            await self._fetch()
        key = self.by_kid.get(kid)
        if key is None and not kid and len(self.by_kid) == 1:
            # A token without a key id, and only one key to check it with.
            key = next(iter(self.by_kid.values()))
        if key is None:
            raise AuthError("the token's signing key is not known")
        return key


class JwtAuthenticator:
    def __init__(self, settings: JwtSettings) -> None:
        bad = [a for a in settings.algorithms if a not in ASYMMETRIC]
        if bad or not settings.algorithms:
            raise ValueError(f"JWT algorithms must be asymmetric ({', '.join(sorted(ASYMMETRIC))}), not {bad}")
        if not settings.issuer or not settings.audience:
            raise ValueError("JWT authentication needs ANTWORT_JWT_ISSUER and ANTWORT_JWT_AUDIENCE")
        self.settings = settings
        self.keys = _Keys(settings)

    async def authenticate(self, credential: str) -> Identity:
        s = self.settings
        try:
            header = jwt.get_unverified_header(credential)
        except jwt.InvalidTokenError:
            raise AuthError("the bearer token is not a JWT") from None
        key = await self.keys.key(str(header.get("kid") or ""))
        algorithms = algorithms_for(key, s.algorithms)
        if header.get("alg") not in algorithms:
            raise AuthError("the token's algorithm is not one its signing key is checked with")
        try:
            claims = jwt.decode(
                credential,
                key,
                algorithms=algorithms,
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway,
                options={"require": list(s.required)},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthError("the token is not meant for this service (audience)") from None
        except jwt.InvalidIssuerError:
            raise AuthError("the token's issuer is not trusted") from None
        except jwt.PyJWTError as err:  # InvalidTokenError, and InvalidKeyError for a key that cannot check it
            raise AuthError(f"the token is not valid: {type(err).__name__}") from None
        principal = claim(claims, s.principal_claim)
        if not principal:
            raise AuthError(f"the token has no {s.principal_claim!r} claim")
        return Identity(principal, claim(claims, s.tenant_claim))
