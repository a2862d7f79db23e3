"""A cheaper way for websockets to read large frames.

websockets' stream reader appends every chunk the socket gives (256 KiB at most) to one
`bytearray`, slices a frame's payload out of it (a copy) and its message assembler joins that slice
into `bytes` (another copy): three copies of every payload, each into a new block as large as the
payload, which glibc maps and unmaps per message (about 2,000 page faults for 8 MiB). This reader
keeps the chunks of a large payload as they came and joins them once, into `bytes`, which the
assembler then hands on as it is (`b"".join` of one `bytes` is that object): one copy, one block.

It replaces the class of the reader of a connection websockets has opened (`install`), keeping its
state, so it relies on websockets' sans-I/O internals (`Protocol.reader`, a `StreamReader` whose
`read_exact` `Frame.parse` calls for a payload), the same from websockets 13 to 17. Where they
differ, `install` leaves the connection as it is.
"""

from __future__ import annotations

from collections.abc import Generator

from websockets.asyncio.client import ClientConnection
from websockets.streams import StreamReader

# Payloads from this size are gathered chunk by chunk; smaller reads go the usual way.
LARGE = 256 * 1024


class LargeFrameReader(StreamReader):
    """A `StreamReader` whose `read_exact` of `LARGE` bytes or more returns `bytes`, joined once
    from the chunks received (or copied once from its buffer when already there), instead of a
    `bytearray` slice of its buffer."""

    # Set while a large read gathers: the chunks, and how many bytes they hold.
    _parts: list[bytes | memoryview] | None = None
    _held = 0

    def feed_data(self, data: bytes | bytearray) -> None:
        if self._parts is None:
            super().feed_data(data)
            return
        if self.eof:
            raise EOFError("stream ended")
        # The socket's chunks are `bytes`, kept as they are; anything mutable is copied.
        self._parts.append(data if isinstance(data, bytes) else bytes(data))
        self._held += len(data)

    def read_exact(self, n: int) -> Generator[None, None, bytearray]:
        if n < LARGE:
            return (yield from super().read_exact(n))
        if len(self.buffer) >= n:
            with memoryview(self.buffer) as view, view[:n] as payload:
                data = bytes(payload)
            del self.buffer[:n]
            return data  # type: ignore[return-value]
        parts: list[bytes | memoryview] = [bytes(self.buffer)]
        del self.buffer[:]
        self._parts, self._held = parts, len(parts[0])
        try:
            while self._held < n:
                if self.eof:
                    raise EOFError(f"stream ends after {self._held} bytes, expected {n} bytes")
                yield
        finally:
            self._parts = None
        extra = self._held - n
        if extra:
            # The last chunk may hold the start of the next frame: that part goes back to the buffer.
            last = memoryview(parts[-1])
            parts[-1] = last[: len(last) - extra]
            self.buffer += last[len(last) - extra :]
        # `bytes`, not the `bytearray` the base class gives: the assembler passes it on uncopied
        # (both are bytes-like to every caller of `read_exact`).
        return b"".join(parts)  # type: ignore[return-value]


def install(ws: ClientConnection) -> bool:
    """Gives `ws` the large-frame reader, keeping its state (the parser may be waiting on it).
    False when websockets' internals are not the ones this was written for."""
    reader = getattr(getattr(ws, "protocol", None), "reader", None)
    if type(reader) is not StreamReader or not isinstance(getattr(reader, "buffer", None), bytearray):
        return False
    reader.__class__ = LargeFrameReader
    return True
