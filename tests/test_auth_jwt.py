"""JWT bearer tokens checked with PyJWT: keys from a JWKS file, a JWKS URL (a real HTTP server,
keys rotated) or a PEM file; issuer, audience and expiry; claims picked by configuration."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec

from antwort_grpc.auth.identity import AuthError, Identity
from antwort_grpc.auth.jwt_tokens import JwtAuthenticator, JwtSettings
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.auth_fixtures import AUDIENCE, ISSUER, Signer, jwt_settings, metadata, signer
from tests.harness import collect, running_gateway, user


def settings(**more: object) -> JwtSettings:
    values = {"issuer": ISSUER, "audience": AUDIENCE, "tenant_claim": "org.id", **more}
    return JwtSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def sign() -> Signer:
    return signer()


@pytest.fixture
def jwks_file(tmp_path: Path, sign: Signer) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(sign.jwks())
    return path


async def test_a_valid_token_names_its_principal_and_tenant(jwks_file: Path, sign: Signer) -> None:
    auth = JwtAuthenticator(settings(jwks=str(jwks_file)))
    assert await auth.authenticate(sign.token("alice", "acme")) == Identity("alice", "acme")
    assert await auth.authenticate(sign.token("alice")) == Identity("alice", "")


async def test_principal_and_tenant_claims_are_configurable(jwks_file: Path, sign: Signer) -> None:
    auth = JwtAuthenticator(settings(jwks=str(jwks_file), principal_claim="email", tenant_claim="tid"))
    token = sign.token("svc-123", email="alice@acme.test", tid="acme")
    assert await auth.authenticate(token) == Identity("alice@acme.test", "acme")
    with pytest.raises(AuthError, match="no 'email' claim"):
        await auth.authenticate(sign.token("svc-123"))


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"lifetime": -120}, "expired"),
        ({"aud": "someone-else"}, "audience"),
        ({"iss": "https://evil.test"}, "issuer"),
        ({"exp": None}, "not valid"),
    ],
    ids=["expired", "wrong audience", "wrong issuer", "no expiry"],
)
async def test_a_token_failing_a_check_is_refused(
    jwks_file: Path, sign: Signer, claims: dict[str, object], message: str
) -> None:
    auth = JwtAuthenticator(settings(jwks=str(jwks_file)))
    lifetime = claims.pop("lifetime", 300)
    token = sign.token("alice", "acme", lifetime=float(lifetime), **claims)  # type: ignore[arg-type]
    if claims.get("exp", 0) is None:
        body = jwt.decode(token, options={"verify_signature": False})
        del body["exp"]
        token = jwt.encode(body, sign.key, algorithm="RS256", headers={"kid": sign.kid})
    with pytest.raises(AuthError, match=message):
        await auth.authenticate(token)


async def test_tokens_signed_by_another_key_or_choosing_their_algorithm_are_refused(
    jwks_file: Path, sign: Signer
) -> None:
    auth = JwtAuthenticator(settings(jwks=str(jwks_file)))
    stranger = Signer(signer().key, kid=sign.kid)
    with pytest.raises(AuthError, match="not valid"):
        await auth.authenticate(stranger.token("alice"))
    # The public key used as an HMAC secret: the classic confusion attack.
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": 4102444800}
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": sign.kid}).encode()).rstrip(b"=")
    import hashlib
    import hmac

    payload = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=")
    mac = hmac.new(sign.public_pem(), header + b"." + payload, hashlib.sha256).digest()
    forged = b".".join([header, payload, base64.urlsafe_b64encode(mac).rstrip(b"=")]).decode()
    with pytest.raises(AuthError):
        await auth.authenticate(forged)
    unsigned = jwt.encode(body, None, algorithm="none")
    with pytest.raises(AuthError):
        await auth.authenticate(unsigned)
    with pytest.raises(AuthError, match="key is not known"):
        await auth.authenticate(Signer(sign.key, kid="other").token("alice"))


def test_symmetric_algorithms_cannot_be_configured(jwks_file: Path) -> None:
    with pytest.raises(ValueError, match="asymmetric"):
        JwtAuthenticator(settings(jwks=str(jwks_file), algorithms=("HS256",)))


async def test_a_pem_public_key_file_checks_tokens(tmp_path: Path, sign: Signer) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(sign.public_pem())
    auth = JwtAuthenticator(settings(public_key_file=pem))
    assert await auth.authenticate(sign.token("bob", "globex")) == Identity("bob", "globex")


@pytest.fixture
async def jwks_server(sign: Signer) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A real HTTP server publishing the JWKS; `document["jwks"]` can be replaced (key rotation)."""
    document = {"jwks": sign.jwks()}
    hits: list[int] = []

    async def serve(request: web.Request) -> web.Response:
        hits.append(1)
        return web.Response(text=document["jwks"], content_type="application/json")

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/.well-known/jwks.json", document
    finally:
        await runner.cleanup()


async def test_a_gateway_with_a_jwks_url_follows_key_rotation(
    jwks_server: tuple[str, dict[str, str]], sign: Signer
) -> None:
    url, document = jwks_server
    provider = ScriptedProvider([[Text("hello")]], repeat=True)
    async with running_gateway(provider=provider, **jwt_settings(jwt_jwks=url, jwt_jwks_refresh_seconds=0)) as gw:
        events = await collect(gw.stub.CreateResponse(user("hi"), metadata=metadata(sign.token("alice", "acme"))))
        assert events[-1].completed.response.status == 3
        rotated = Signer(signer().key, kid="key-2")
        document["jwks"] = rotated.jwks()
        events = await collect(gw.stub.CreateResponse(user("hi"), metadata=metadata(rotated.token("alice", "acme"))))
        assert events[-1].completed.response.status == 3
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(gw.stub.CreateResponse(user("hi"), metadata=metadata(sign.token("alice", "acme"))))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _ec_jwk(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, object]:
    return {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig"}


@pytest.mark.parametrize("case", ["RS256 naming an EC key", "ES256 against an RSA public-key file"])
async def test_a_token_whose_algorithm_does_not_fit_its_key_is_unauthenticated_with_one_log_line(
    tmp_path: Path, sign: Signer, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": 4102444800}
    if case == "RS256 naming an EC key":
        jwks = tmp_path / "jwks.json"
        rsa_jwks = json.loads(sign.jwks())["keys"]
        jwks.write_text(json.dumps({"keys": [*rsa_jwks, _ec_jwk(ec_key, "ec-1")]}))
        where: dict[str, object] = {"jwt_jwks": str(jwks)}
        token = jwt.encode(body, sign.key, algorithm="RS256", headers={"kid": "ec-1"})
    else:
        pem = tmp_path / "key.pem"
        pem.write_bytes(sign.public_pem())
        where = {"jwt_public_key_file": pem}
        token = jwt.encode(body, ec_key, algorithm="ES256")
    provider = ScriptedProvider([[Text("hello")]], repeat=True)
    async with running_gateway(provider=provider, **jwt_settings(**where)) as gw:
        caplog.clear()
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await collect(gw.stub.CreateResponse(user("hi"), metadata=metadata(token)))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "Traceback" not in (refused.value.details() or "")
        # Still a gateway that serves the right tokens.
        events = await collect(gw.stub.CreateResponse(user("hi"), metadata=metadata(sign.token("alice", "acme"))))
        assert events[-1].completed.response.status == 3
    assert provider.requests and len(provider.requests) == 1
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in noisy), [r.getMessage() for r in noisy]
    assert len(noisy) <= 2, "at most one line a refused call"
