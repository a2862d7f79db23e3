"""Reading herald's frames: once the connection is open, the data frames are split out of what the
socket gives here instead of by websockets' parser, and large payloads are read straight into
buffers of their own, used again.

websockets' parser costs a small message more than the client's own handling of it: the bytes
are appended to its reader's buffer, a chain of generators reads the header and the payload
(copied out again), and a `Frame` goes through checks and an event list. `FrameReader` reads a
frame's header where it lies and hands a data frame's payload on at once. Control frames (ping,
pong, close) and anything it does not take for a valid data frame go to websockets whole, as the
bytes they came as: its parser then always starts at a frame's first byte, and it still answers
pings, runs the closing handshake and fails the connection on a protocol error.

For a payload of `LARGE` bytes or more the reader hands out a buffer the size of the payload
(`space`): the connection (`_connection.py`, an asyncio `BufferedProtocol`) has the kernel read
into it, and the frame's payload is that buffer, not copied again. The buffers come from a
`BufferPool` of a few, which lends one again once nothing but the pool refers to it: the message
and every view of its payload are gone. So a subscriber that handles images one after another
reads every one into memory already mapped, where a new block of the image's size would be
mapped and page-faulted in afresh for almost every message. The reference count that tells is
exact on CPython with its GIL; elsewhere (PyPy, a free-threaded build) every payload gets a new
buffer.

Until the handshake is done websockets reads everything. The reader takes over once websockets'
parser waits between two frames with nothing buffered (`BoundaryReader`, put in place of the
connection's reader by changing its class); that relies on websockets' sans-I/O internals:
`Protocol.reader`, a `StreamReader` with a `bytearray` `buffer` whose `at_eof` the parser waits
in between frames, the same from websockets 16 to 17. Where they differ, `install` leaves the
reader as it is and websockets keeps reading.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator

from websockets.streams import StreamReader

# Payloads from this size are read into a buffer of their own; smaller ones are copied out of the
# connection's read buffer.
LARGE = 64 * 1024

# Whether `sys.getrefcount` tells exactly who refers to a buffer.
_EXACT_REFCOUNTS = sys.implementation.name == "cpython" and bool(getattr(sys, "_is_gil_enabled", lambda: True)())

# First header byte: FIN, the reserved bits, the opcode. Second: MASK, the payload length.
_FIN, _RSV, _OPCODE, _MASK, _LEN = 0x80, 0x70, 0x0F, 0x80, 0x7F
# The data opcodes: continuation, text, binary.
_CONT, _TEXT, _BINARY = 0x0, 0x1, 0x2


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


class BoundaryReader(StreamReader):
    """websockets' `StreamReader`, telling whether its parser waits between two frames."""

    between_frames = False

    def at_eof(self) -> Generator[None, None, bool]:
        self.between_frames = True
        try:
            return (yield from super().at_eof())
        finally:
            self.between_frames = False


def install(reader: object) -> BoundaryReader | None:
    """Makes websockets' `reader` a `BoundaryReader`, keeping its state; None when it is not the
    reader this was written for."""
    if type(reader) is not StreamReader or not isinstance(getattr(reader, "buffer", None), bytearray):
        return None
    reader.__class__ = BoundaryReader
    assert isinstance(reader, BoundaryReader)
    return reader


# A data frame: its first header byte (FIN and opcode) and its payload.
DataHandler = Callable[[int, bytes | bytearray], bool]
# Any other frame, or bytes that do not make a valid data frame: for websockets, as they came.
OtherHandler = Callable[[bytes], bool]


class FrameReader:
    """Splits the bytes of server frames into frames: data frames to `on_data`, the rest to
    `on_other`. A frame cut by the end of a read waits for the rest. Once a handler returns False
    (the connection is no longer open: a close frame, a protocol error) the reader stops: what
    follows goes to `on_other` as it is, for websockets to read as it closes."""

    def __init__(self, pool: BufferPool, on_data: DataHandler, on_other: OtherHandler) -> None:
        self._pool = pool
        self._on_data = on_data
        self._on_other = on_other
        # The start of a frame whose rest has not come yet.
        self._partial = b""
        # While a large payload is read: its buffer, how many of its bytes are there, and its
        # frame's first header byte.
        self._into: bytearray | None = None
        self._held = 0
        self._first = 0
        self.active = True

    def space(self) -> memoryview | None:
        """Where the next bytes from the socket belong: the rest of a large payload's buffer while
        one is read, else None (they go to `feed`)."""
        into = self._into
        return None if into is None else memoryview(into)[self._held :]

    def filled(self, n: int) -> None:
        """`n` more bytes were written into `space()`."""
        self._held += n
        into = self._into
        if into is not None and self._held >= len(into):
            self._into = None
            self.active = self._on_data(self._first, into)

    def feed(self, data: bytes | memoryview) -> None:
        """Bytes from the socket (not written into `space()`)."""
        data = memoryview(data)  # its slices are views, where slices of bytes are copies
        into = self._into
        if into is not None:  # the rest of a large payload, then what follows it
            n = min(len(data), len(into) - self._held)
            into[self._held : self._held + n] = data[:n]
            self.filled(n)
            data = data[n:]
            if not data:
                return
        if not self.active:
            self._on_other(bytes(data))
            return
        if self._partial:
            data = memoryview(self._partial + data)
            self._partial = b""
        end = len(data)
        at = 0
        go_on = True
        while go_on and end - at >= 2:
            first, second = data[at], data[at + 1]
            n = second & _LEN
            start = at + 2
            if n == 126:
                start += 2
                if start > end:
                    break
                n = int.from_bytes(data[at + 2 : start], "big")
            elif n == 127:
                start += 8
                if start > end:
                    break
                n = int.from_bytes(data[at + 2 : start], "big")
            opcode = first & _OPCODE
            if opcode > _BINARY or first & _RSV or second & _MASK:
                # A control frame, or not a valid data frame from a server: websockets' to read.
                if start + n > end:
                    break
                go_on = self._on_other(bytes(data[at : start + n]))
                at = start + n
                continue
            if n >= LARGE:
                into = self._pool.take(n)
                held = min(end - start, n)
                into[:held] = data[start : start + held]
                at = start + held
                if held < n:
                    self._into, self._held, self._first = into, held, first
                    return  # the rest of the payload is read into `space()`
                go_on = self._on_data(first, into)
                continue
            if start + n > end:
                break
            go_on = self._on_data(first, bytes(data[start : start + n]))
            at = start + n
        if not go_on:
            self.active = False
            if at < end:
                self._on_other(bytes(data[at:end]))
        elif at < end:
            self._partial = bytes(data[at:end])
