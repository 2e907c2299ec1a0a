"""A real Go client (grpc-go, code generated from protos/ with their go_package) against the
gateway: streaming, requires_action and its continuation, and a typed NOT_FOUND."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.harness import running_gateway

ROOT = Path(__file__).resolve().parents[2]
GO_PACKAGE = "github.com/antwort-grpc/antwort-grpc/gen/go"
TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"{missing} missing: scripts/system-deps.sh installs them (Debian's Go toolchain)"
    gopath = tmp_path_factory.mktemp("gopath")
    generated = gopath / "src" / GO_PACKAGE
    generated.mkdir(parents=True)
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos/antwort/v1").glob("*.proto"))
    subprocess.run(
        ["protoc", "-Iprotos", f"--go_out={generated}", "--go_opt=paths=source_relative",
         f"--go-grpc_out={generated}", "--go-grpc_opt=paths=source_relative", *protos],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    client_dir = gopath / "src" / "antwortclient"
    client_dir.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "go_client.go", client_dir / "main.go")
    binary = gopath / "go-client"
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{gopath}:/usr/share/gocode",
        "GOCACHE": str(tmp_path_factory.getbasetemp() / "gocache"),
    }
    build = subprocess.run(
        ["go", "build", "-o", str(binary), "antwortclient"], env=env, capture_output=True, text=True, timeout=600
    )
    assert build.returncode == 0, build.stderr
    return binary


async def test_go_client_streams_and_continues_a_requires_action_response(go_client: Path) -> None:
    provider = ScriptedProvider(
        [[Call.of("get_weather", {"city": "Paris"}, call_id="call_go")], [Text("Sunny, 21 degrees.")]]
    )
    async with running_gateway(provider=provider) as gw:
        proc = await asyncio.create_subprocess_exec(
            str(go_client), gw.target, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    lines = out.decode().splitlines()
    assert proc.returncode == 0, lines
    assert lines[0] == "1 created"
    assert any(line.endswith("requires_action RESPONSE_STATUS_REQUIRES_ACTION call_go") for line in lines)
    assert any(line.endswith("completed RESPONSE_STATUS_COMPLETED") for line in lines)
    assert any('output_text_delta "Sunny,"' in line for line in lines)
    assert "NotFound" in lines[-1] and "resp_missing" in lines[-1]
