"""Credentials for the authentication tests: an API key file and JWTs signed by a key of a JWKS."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from antwort_grpc.auth.apikeys import key_line, new_key

ISSUER = "https://idp.test"
AUDIENCE = "antwort"
# principal -> tenant: alice and carol share a tenant, bob is in another.
PEOPLE = {"alice": "acme", "bob": "globex", "carol": "acme"}


def metadata(credential: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {credential}"),)


@dataclass
class Credentials:
    settings: dict[str, Any]
    tokens: dict[str, str] = field(default_factory=dict)

    def of(self, principal: str) -> tuple[tuple[str, str]]:
        return metadata(self.tokens[principal])


def api_keys(directory: Path) -> Credentials:
    keys = {name: new_key() for name in PEOPLE}
    path = directory / "api-keys.txt"
    lines = ["# test keys", *(key_line(keys[n], n, t) for n, t in PEOPLE.items())]
    path.write_text("\n".join(lines) + "\n")
    return Credentials({"auth": "api_key", "api_keys_file": path}, keys)


@dataclass
class Signer:
    key: rsa.RSAPrivateKey
    kid: str = "key-1"

    def jwks(self) -> str:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return json.dumps({"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]})

    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def token(self, principal: str, tenant: str = "", *, lifetime: float = 300, **claims: Any) -> str:
        now = int(time.time())
        body: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": principal, "iat": now, "exp": now + lifetime}
        if tenant:
            body["org"] = {"id": tenant}
        body.update(claims)
        return jwt.encode(body, self.key, algorithm="RS256", headers={"kid": self.kid})


def signer() -> Signer:
    return Signer(rsa.generate_private_key(public_exponent=65537, key_size=2048))


def jwt_settings(**more: Any) -> dict[str, Any]:
    # The tenant sits in a nested claim here, to show claims are configurable.
    return {"auth": "jwt", "jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_tenant_claim": "org.id", **more}


def jwts(directory: Path, sign: Signer | None = None) -> Credentials:
    sign = sign or signer()
    path = directory / "jwks.json"
    path.write_text(sign.jwks())
    tokens = {name: sign.token(name, tenant) for name, tenant in PEOPLE.items()}
    return Credentials(jwt_settings(jwt_jwks=str(path)), tokens)
