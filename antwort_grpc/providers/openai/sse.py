"""An incremental Server-Sent Events parser: bytes in, the data of complete events out.

It works on whatever blocks the socket delivers (several events per read is the common case on
loopback), so the hot path is one bytes.split per read, not one await per line.
"""

from __future__ import annotations


class SseParser:
    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, block: bytes) -> list[bytes]:
        """Returns the data payloads of the events that `block` completed."""
        buffer = self._buffer + block if self._buffer else block
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # Comments (": ping") and the other fields (event:, id:, retry:) carry nothing we
            # use: backends that report errors in-band put an "error" object in the data.
        return events

    def finish(self) -> list[bytes]:
        """The stream ended: an event without its blank line still counts."""
        tail = self.feed(b"\n\n") if self._buffer or self._data else []
        return tail
