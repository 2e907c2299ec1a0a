"""`observability_cpu_ratio`: the gateway's CPU per request with Prometheus metrics and
OpenTelemetry traces on, sampled as docs/observability.md recommends (parent-based, 10 % of root
traces; exported to a local OTLP/gRPC receiver) ÷ the same gateway with both off;
`observability_full_cpu_ratio`, every trace sampled; `metrics_cpu_ratio`, metrics alone; and
`jwt_auth_cpu_ratio`, the same for JWT authentication (RS256, a JWKS file) against none. Five
gateway processes side by side, the same streamed requests through the real OpenAI-compatible
provider to the fake backend, the blocks interleaved in a rotating order each round.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from antwort_grpc import pb
from bench.backend import model_name
from bench.clients import channel, drive
from bench.figures import Scale, gateway, running
from bench.procs import Child
from bench.stats import Results

SIDES = ["plain", "metrics", "observed", "sampled", "jwt"]
# The recommended sampling: a tenth of the root traces (OTEL_TRACES_SAMPLER_ARG).
SAMPLED_RATIO = 0.1
CONCURRENCY = 4


def _jwks_and_token(directory: Path) -> tuple[Path, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    path = directory / "jwks.json"
    path.write_text(json.dumps({"keys": [{**public, "kid": "bench", "alg": "RS256", "use": "sig"}]}))
    claims = {"iss": "bench", "aud": "bench", "sub": "bench-client", "exp": int(time.time()) + 86400}
    return path, jwt.encode(claims, key, algorithm="RS256", headers={"kid": "bench"})


async def observability_cost(scale: Scale, results: Results, backend: Child) -> None:
    request = pb.CreateResponseRequest(model=model_name(words=20), input_text="hello", stream=True)
    requests = max(10, scale.c1_requests)
    with tempfile.TemporaryDirectory() as tmp:
        jwks, token = _jwks_and_token(Path(tmp))
        base = ("--provider", "openai", "--backend-url", backend.url)
        async with contextlib.AsyncExitStack() as stack:
            sink = await stack.enter_async_context(running("otlp", "bench.otlp_sink"))
            gateways = {
                "plain": await stack.enter_async_context(gateway(*base)),
                "metrics": await stack.enter_async_context(gateway(*base, "--metrics")),
                "observed": await stack.enter_async_context(
                    gateway(*base, "--metrics", "--otlp-endpoint", f"http://{sink.target}")
                ),
                "sampled": await stack.enter_async_context(
                    gateway(
                        *base,
                        "--metrics",
                        "--otlp-endpoint",
                        f"http://{sink.target}",
                        "--trace-ratio",
                        str(SAMPLED_RATIO),
                    )
                ),
                "jwt": await stack.enter_async_context(gateway(*base, "--jwt-jwks", str(jwks))),
            }
            metadata: dict[str, Any] = {"jwt": (("authorization", f"Bearer {token}"),)}
            calls = {}
            for side, gw in gateways.items():
                stub = pb.ResponsesServiceStub(await stack.enter_async_context(channel(gw.target)))
                calls[side] = _caller(stub, request, metadata.get(side))
                await drive(calls[side], 20, CONCURRENCY)  # warm-up
            for n in range(scale.rounds):
                cpu: dict[str, float] = {}
                order = SIDES[n % len(SIDES) :] + SIDES[: n % len(SIDES)]
                for side in order:
                    before = gateways[side].cpu_seconds()
                    await drive(calls[side], requests, CONCURRENCY)
                    cpu[side] = (gateways[side].cpu_seconds() - before) / requests
                results.add("observability_cpu_ratio", cpu["sampled"] / cpu["plain"])
                results.add("observability_full_cpu_ratio", cpu["observed"] / cpu["plain"])
                results.add("metrics_cpu_ratio", cpu["metrics"] / cpu["plain"])
                results.add("jwt_auth_cpu_ratio", cpu["jwt"] / cpu["plain"])
                results.add("observability_cpu_ms_per_request", cpu["observed"] * 1e3, "ms")
                results.add("plain_cpu_ms_per_request", cpu["plain"] * 1e3, "ms")
                results.add("jwt_auth_cpu_us_per_request", (cpu["jwt"] - cpu["plain"]) * 1e6, "us")


def _caller(stub: Any, request: pb.CreateResponseRequest, metadata: Any) -> Any:
    async def call() -> None:
        terminal = ""
        async for message in stub.CreateResponse(request, metadata=metadata):
            terminal = message.event.WhichOneof("event") or ""
        if terminal != "completed":
            raise RuntimeError(f"observability figure: the response ended {terminal}")

    return call
