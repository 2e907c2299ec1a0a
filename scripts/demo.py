"""`make demo`: the agentic loop end to end, with no model to install.

Starts the fake OpenAI-compatible backend (scripted answers, real HTTP + SSE), starts the gateway
against it (`antwort-grpc serve --backend-url ... --model ...`), and holds a conversation over
gRPC: a question that makes the model call a function tool, the tool result sent back by the
client, and a follow-up that continues the conversation with previous_response_id.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
DIM, RESET = ("\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def start(command: list[str]) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def get_weather(arguments: str) -> str:
    """The client-side tool: the gateway hands the call back to us (requires_action)."""
    city = json.loads(arguments).get("city", "?")
    return json.dumps({"city": city, "temperature_c": 18, "conditions": "sunny"})


async def wait_serving(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for _ in range(100):
        try:
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the gateway did not become ready")


async def turn(stub: Any, request: pb.CreateResponseRequest) -> pb.Response:
    request.stream = True
    request.model = "demo-model"
    response = pb.Response()
    async for message in stub.CreateResponse(request):
        event = message.event
        kind = event.WhichOneof("event")
        payload = getattr(event, kind)
        if kind == "reasoning_text_delta":
            print(f"{DIM}{payload.delta}{RESET}", end="", flush=True)
        elif kind == "output_text_delta":
            print(payload.delta, end="", flush=True)
        elif kind == "output_item_added":
            item_kind = payload.item.WhichOneof("kind")
            label = {"reasoning": "thinking", "message": "assistant", "function_call": "tool call"}.get(item_kind)
            if label:
                print(f"\n  [{label}] ", end="", flush=True)
            if item_kind == "function_call":
                print(f"{payload.item.function_call.name}(", end="", flush=True)
        elif kind == "function_call_arguments_delta":
            print(payload.delta, end="", flush=True)
        elif kind == "function_call_arguments_done":
            print(")", end="", flush=True)
        elif hasattr(payload, "response") and kind not in ("created", "in_progress"):
            response = payload.response
            status = pb.ResponseStatus.Name(response.status).removeprefix("RESPONSE_STATUS_").lower()
            print(f"\n  -> {status} ({response.id}, {response.usage.total_tokens} tokens)")
    return response


async def conversation(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        await wait_serving(channel)
        stub = pb.ResponsesServiceStub(channel)
        weather = pb.Tool(function=pb.FunctionTool(name="get_weather", description="Current weather in a city"))
        weather.function.parameters.update(
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        )

        print("\nuser: What's the weather in Paris?")
        first = await turn(stub, pb.CreateResponseRequest(input_text="What's the weather in Paris?", tools=[weather]))
        calls = [item.function_call for item in first.output if item.WhichOneof("kind") == "function_call"]
        outputs = [
            pb.Item(function_call_output=pb.FunctionCallOutput(call_id=c.call_id, output=get_weather(c.arguments)))
            for c in calls
        ]
        for item in outputs:
            print(f"\nclient runs the tool: {item.function_call_output.output}")
        second = await turn(
            stub,
            pb.CreateResponseRequest(
                previous_response_id=first.id, input_items=pb.ItemList(items=outputs), tools=[weather]
            ),
        )
        print("\nuser: Should I take an umbrella?")
        await turn(
            stub,
            pb.CreateResponseRequest(
                previous_response_id=second.id, input_text="Should I take an umbrella?", tools=[weather]
            ),
        )


def main() -> None:
    script = str(HERE / "demo_script.json")
    backend, line = start([sys.executable, "-m", "antwort_grpc.testing.fake_openai", "--port", "0", "--script", script])
    backend_url = line.rsplit(" ", 1)[-1]
    target = f"127.0.0.1:{free_port()}"
    print(f"fake model backend: {backend_url}")
    print(f"gateway:            antwort-grpc serve --backend-url {backend_url} --model demo-model --listen {target}")
    gateway = subprocess.Popen(
        [str(BIN / "antwort-grpc"), "serve", "--backend-url", backend_url, "--model", "demo-model",
         "--listen", target, "--store", "memory", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        asyncio.run(conversation(target))
    finally:
        for process in (gateway, backend):
            process.terminate()
        for process in (gateway, backend):
            process.wait(timeout=15)


if __name__ == "__main__":
    main()
