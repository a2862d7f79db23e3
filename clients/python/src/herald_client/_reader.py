"""Large payloads read straight into buffers of their own, and those buffers used again.

websockets' stream reader appends what the socket gives to one `bytearray` and slices each frame's
payload out of it; its message assembler then joins the slices into `bytes`. For an image of a
few MiB that is two copies after the kernel's, each into a new block as large as the image, and a
new block of that size is mapped and page-faulted in afresh for almost every message, which costs
more than the copies. This reader instead hands out, for a payload of `LARGE` bytes or more, a
buffer the size of the payload (`PayloadReader.space`): the connection (`_connection.py`, an
asyncio `BufferedProtocol`) has the kernel read into it, and the frame's payload is that buffer,
not copied again.

The buffers come from a `BufferPool` of a few, which lends one again once nothing but the pool
refers to it: the message and every view of its payload are gone. So a subscriber that handles
images one after another reads every one into memory already mapped. The reference count that
tells is exact on CPython with its GIL; elsewhere (PyPy, a free-threaded build) every payload gets
a new buffer.

The reader takes the place of websockets' own by changing the class of the one a connection was
made with (its state is kept: the parser may be waiting on it), so it relies on websockets'
sans-I/O internals: `Protocol.reader`, a `StreamReader` with a `bytearray` `buffer`, whose
`read_exact` `Frame.parse` calls for a payload, the same from websockets 14 to 17. Where they
differ, `install` leaves the connection's reader as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Generator

from websockets.streams import StreamReader

# Payloads from this size are read into a buffer of their own; smaller reads go websockets' way.
LARGE = 64 * 1024

# Whether `sys.getrefcount` tells exactly who refers to a buffer.
_EXACT_REFCOUNTS = sys.implementation.name == "cpython" and bool(getattr(sys, "_is_gil_enabled", lambda: True)())


class BufferPool:
    """Up to `size` buffers, each lent again once nothing else refers to it. A buffer lent is a
    `bytearray` of exactly the size asked for; the pool resizes one it has rather than make one."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._buffers: list[bytearray] = []

    def take(self, n: int) -> bytearray:
        if not _EXACT_REFCOUNTS:
            return bytearray(n)
        buffers = self._buffers
        for i in range(len(buffers)):
            # References: the list's, and getrefcount's argument. A message, a view of its
            # payload or a numpy array over it each hold one more.
            if sys.getrefcount(buffers[i]) == 2:
                buffer = buffers[i]
                have = len(buffer)
                if have > n:
                    del buffer[n:]
                elif have < n:
                    buffer.extend(bytes(n - have))
                return buffer
        buffer = bytearray(n)
        if len(buffers) < self._size:
            buffers.append(buffer)
        return buffer


class PayloadReader(StreamReader):
    """A `StreamReader` whose `read_exact` of `LARGE` bytes or more returns a buffer of the pool,
    filled by `feed_data` or, without a copy, through `space` and `filled`."""

    pool: BufferPool
    # Set while a large payload is read: its buffer, and how many of its bytes are there.
    into: bytearray | None = None
    held = 0

    def space(self) -> memoryview | None:
        """Where the next bytes from the socket belong: the rest of a large payload's buffer while
        one is read, else None (they go through `feed_data`)."""
        into = self.into
        return None if into is None else memoryview(into)[self.held :]

    def filled(self, n: int) -> bool:
        """`n` more bytes were written into `space()`; True once the payload is complete (the
        parser may go on)."""
        self.held += n
        return self.into is not None and self.held >= len(self.into)

    def feed_data(self, data: bytes | bytearray | memoryview) -> None:
        if self.eof:
            raise EOFError("stream ended")
        into = self.into
        if into is None:
            self.buffer += data
            return
        # The payload's part goes into its buffer; anything after it (the next frames) is buffered.
        n = min(len(data), len(into) - self.held)
        with memoryview(data) as view:
            into[self.held : self.held + n] = view[:n]
            self.held += n
            if n < len(view):
                self.buffer += view[n:]

    def read_exact(self, n: int) -> Generator[None, None, bytearray]:
        if n < LARGE:
            return (yield from super().read_exact(n))
        into = self.pool.take(n)
        held = min(len(self.buffer), n)
        with memoryview(self.buffer) as view:
            into[:held] = view[:held]
        del self.buffer[:held]
        self.into, self.held = into, held
        try:
            while self.held < n:
                if self.eof:
                    raise EOFError(f"stream ends after {self.held} bytes, expected {n} bytes")
                yield
        finally:
            self.into = None
        return into


def install(reader: object, pool: BufferPool) -> PayloadReader | None:
    """Makes websockets' `reader` a `PayloadReader` drawing on `pool`, keeping its state; None
    when it is not the reader this was written for."""
    if type(reader) is not StreamReader or not isinstance(getattr(reader, "buffer", None), bytearray):
        return None
    reader.__class__ = PayloadReader
    assert isinstance(reader, PayloadReader)
    reader.pool = pool
    return reader
