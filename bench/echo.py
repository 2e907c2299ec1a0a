"""The transport limit: a minimal grpc.aio server-streaming echo, `python -m bench.echo`.

It serves the gateway's method path (/antwort.v1.ResponsesService/CreateResponse), so the very
same client code reads it, and streams `--count` copies of one prebuilt CreateResponseResponse
shaped and sized like the gateway's text-delta events. What is left is grpc.aio's own cost of
sending a message: the most any gateway in Python can stream. With `--delay` it paces each stream
as the 1,000-stream figure's backend paces its tokens, and ends it with `completed`: the transport's
own cost per message at that scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from antwort_grpc import pb
from antwort_grpc.ids import new_id
from bench.procs import until_stopped

_COMPLETED = pb.ResponseCompletedEvent(
    response=pb.Response(id="resp_echo", status=pb.ResponseStatus.RESPONSE_STATUS_COMPLETED)
)


def delta_message(text: str, sequence_number: int) -> pb.CreateResponseResponse:
    """A text delta as the gateway sends it (the same field sizes)."""
    event = pb.StreamEvent(
        sequence_number=sequence_number,
        output_text_delta=pb.OutputTextDeltaEvent(item_id=new_id("msg"), output_index=0, content_index=0, delta=text),
    )
    return pb.CreateResponseResponse(event=event)


async def _serve(count: int, text: str, delay: float) -> None:
    message = delta_message(text, count)

    async def create(request: pb.CreateResponseRequest, context: Any) -> AsyncIterator[pb.CreateResponseResponse]:
        for _ in range(count):
            yield message

    async def paced(request: pb.CreateResponseRequest, context: Any) -> AsyncIterator[pb.CreateResponseResponse]:
        # The pace of the 1,000-stream figure's backend: one delta every `delay` seconds, each
        # numbered as the gateway numbers its events, then a `completed` event, so the same load
        # generator reads it as a finished conversation. The messages are built as the stream
        # goes (a gateway builds each event too); building one is a small part of sending it.
        for n in range(1, count + 1):
            await asyncio.sleep(delay)
            yield delta_message(text, n)
        yield pb.CreateResponseResponse(event=pb.StreamEvent(sequence_number=count + 1, completed=_COMPLETED))

    handler = grpc.method_handlers_generic_handler(
        "antwort.v1.ResponsesService",
        {
            "CreateResponse": grpc.unary_stream_rpc_method_handler(
                paced if delay else create,
                request_deserializer=pb.CreateResponseRequest.FromString,
                response_serializer=pb.CreateResponseResponse.SerializeToString,
            )
        },
    )
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"READY {port}", flush=True)
    await until_stopped()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--text", default="token ")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each message (then `completed`)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.count, args.text, args.delay))


if __name__ == "__main__":
    main()
