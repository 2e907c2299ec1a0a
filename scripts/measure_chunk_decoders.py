"""Measures the CPU time to decode one chunk of a streamed chat-completions answer, per decoder:
the pydantic model (wire.py), msgspec (chunks.py, what the provider uses), and orjson and json
alone (a dict, nothing checked: the floor a checking decoder is measured against).

    .venv/bin/python scripts/measure_chunk_decoders.py [--number 100000]
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable

import orjson

from antwort_grpc.providers.openai import chunks, wire

# A content chunk as vLLM and the bench backend send it (one per token).
CHUNK = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":"word "},"finish_reason":null}]}'
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--number", type=int, default=100_000)
    args = parser.parse_args()
    decoders: dict[str, Callable[[], object]] = {
        "pydantic (wire.ChatCompletionChunk)": lambda: wire.ChatCompletionChunk.model_validate_json(CHUNK),
        "msgspec (chunks.decode_chunk)": lambda: chunks.decode_chunk(CHUNK),
        "orjson.loads (no checks)": lambda: orjson.loads(CHUNK),
        "json.loads (no checks)": lambda: json.loads(CHUNK),
    }
    for name, decode in decoders.items():
        best = min(timeit.repeat(decode, number=args.number, repeat=5)) / args.number
        print(f"{name}: {best * 1e6:.2f} µs per chunk")


if __name__ == "__main__":
    main()
