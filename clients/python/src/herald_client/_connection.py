"""herald's WebSocket connection: websockets' asyncio client connection, with a shorter way for
messages in and out.

websockets (its handshake, parser, framing, masking, pings and closing handshake) does the
WebSocket protocol; what this subclass changes is how a message reaches the client and how the
client's messages reach the socket, where websockets' general-purpose path costs a client that
moves thousands of messages a second, or images of many MiB, more than the protocol itself:

- **In:** each message is handed to the client's `receiver` as soon as it is parsed, inside the
  transport's callback, instead of being queued for a task that `recv()`s it and hands it on: no
  task switch per message. Once the handshake is done the client splits the data frames out of
  what the socket gives itself, and websockets parses only the control frames (`_reader.py`). The
  connection reads as an asyncio `BufferedProtocol` on asyncio's and uvloop's transports alike:
  the kernel reads small frames into one reused buffer and a large payload straight into its own.
- **Out:** a whole message is framed, masked and written to the transport at once (`write_now`),
  without the per-send context manager, lock and drain of `send()` or the frame object, checks and
  `BytesIO` of websockets' serializer, and awaits only when the transport's buffer is full. Credit
  for lossless subscriptions goes this way, synchronously, the moment a message is handled. A
  binary message goes as one frame whose JSON header and payload are never joined
  (`send_binary`): the header is masked on its own and the payload in blocks that are views of
  the caller's buffer, each masked into a block of its own and written as it is, the first in one
  system call with the frame's header (`_Writer`). One frame, not fragments, also spares herald
  putting the fragments back together. While a large frame is being written, other messages wait
  and the control frames websockets writes (pings, pongs, the close) are held until it is whole;
  a keepalive ping is sent, and its pong awaited, only then. A frame that stops going out for
  the ping timeout drops the connection, as the unanswered ping would.

It relies on websockets' asyncio internals besides its public sans-I/O `Protocol`: the
`create_connection` hook, `process_event`, `data_received`, `send_data`, `ping`, `ping_timeout`,
`drain`, `paused` and `response`, the same from websockets 16 to 17 (tests/test_connection.py
checks the installed one).
"""

from __future__ import annotations

import asyncio
import os
import struct
from asyncio import selector_events
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.protocol import Event, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # a websockets built without its C extension
    from websockets.utils import apply_mask

from . import _reader
from ._errors import NotConnected

# Reads that are not into a large payload's buffer land in this many bytes, reused (asyncio's own
# transport reads at most this much at a time too).
_READ = 64 * 1024

# The size of the blocks a binary payload is masked in, a multiple of 4 (the key's length): an
# image up to 1024² × 2 bytes goes as one block, masked at once and written in one call. Each
# block is a `transport.write` and often a wait for the transport to drain, so the fewer the
# blocks, the less a large image costs beyond its copies (bench/RESULTS.md). A larger
# payload goes in blocks of this size: the masked copy held at once stays this large, and after
# the first message glibc's dynamic mmap threshold (which rises to a freed block's size, up to
# 32 MiB) has each block come from the heap, reused, not mapped and page-faulted in afresh.
FRAGMENT = 2 * 1024 * 1024

# Masking keys are drawn from os.urandom this many at a time (one system call for many frames).
_KEYS = 1024

_TEXT, _BINARY, _CONT, _FIN = 0x1, 0x2, 0x0, 0x80

# asyncio's transport of a plain (not TLS) socket, where `_Writer` may write to the socket itself.
_PlainTransport: type | None = getattr(selector_events, "_SelectorSocketTransport", None)

Receiver = Callable[[str | bytes | bytearray], None]


class Connection(ClientConnection, asyncio.BufferedProtocol):
    """A websockets client connection that hands each message to `receiver` as it is parsed and
    writes whole messages synchronously. Make it with ``websockets.asyncio.client.connect(...,
    create_connection=Connection)``, then `attach` the receiver."""

    def __init__(self, protocol: ClientProtocol, *args: Any, **kwargs: Any) -> None:
        super().__init__(protocol, *args, **kwargs)
        self._receiver: Receiver | None = None
        # Messages parsed before the receiver was attached (herald speaks first only to answer,
        # so normally none).
        self._early: list[str | bytes | bytearray] = []
        # The fragments of a message that came in several frames, and whether it is text.
        self._fragments: list[bytes | bytearray] = []
        self._text = False
        self._scratch = memoryview(bytearray(_READ))
        # Once the handshake is done and websockets' parser waits between frames, `_frames` reads
        # instead of it (`_own`); `_in_space`: the last read went into a large payload's buffer.
        self._boundary = _reader.install(protocol.reader)
        self._frames = _reader.FrameReader(_reader.BufferPool(), self._data_frame, self._other_frame)
        self._own = False
        self._in_space = False
        # Set while a large message's frame is being written: nothing else may go into it.
        self._sending: asyncio.Future[None] | None = None
        self._writer: _Writer  # once connected
        # Blocks of large frames written so far, and the timer that drops a frame that stalls.
        self._blocks = 0
        self._stalled: asyncio.TimerHandle | None = None
        self._keys = b""
        self._key_at = 0

    def attach(self, receiver: Receiver) -> None:
        """From now on every message goes to `receiver` (a `str` for text, else bytes-like)."""
        self._receiver = receiver
        early, self._early = self._early, []
        for message in early:
            receiver(message)

    # ----------------------------------------------------------------------------------------
    # Reading

    def get_buffer(self, sizehint: int) -> memoryview:
        space = self._frames.space() if self._own else None
        self._in_space = space is not None
        return self._scratch if space is None else space

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # A transport that is given a protocol which is also an `asyncio.Protocol` (this one is,
        # as websockets' connection) may read through `data_received` (uvloop's do): with only a
        # `BufferedProtocol` in front of it, every transport reads through `get_buffer`.
        transport.set_protocol(_Reads(self))
        self._writer = _Writer(self.transport)

    def buffer_updated(self, nbytes: int) -> None:
        if self._in_space:
            self._frames.filled(nbytes)
        else:
            self.data_received(self._scratch[:nbytes])  # type: ignore[arg-type]  # nothing keeps it

    def data_received(self, data: bytes) -> None:
        """Bytes from the socket: what `buffer_updated` read into the reused buffer."""
        if self._own:
            self._frames.feed(data)
            return
        super().data_received(data)  # websockets copies what it keeps
        reader = self._boundary
        if (
            reader is not None
            and reader.between_frames
            and not reader.buffer
            and self.response is not None
            and self.protocol.state is State.OPEN
            and self.protocol.current_size is None
        ):
            self._own = True

    def process_event(self, event: Event) -> None:
        if self.response is None or not isinstance(event, Frame) or event.opcode not in _DATA:
            super().process_event(event)  # the handshake's response, and control frames
            return
        data = event.data if isinstance(event.data, (bytes, bytearray)) else bytes(event.data)
        self._data_frame(event.opcode.value | (_FIN if event.fin else 0), data)

    def _data_frame(self, first: int, data: bytes | bytearray) -> bool:
        """A data frame (`first`: its first header byte): a message to the receiver once it is
        whole. False when it fails the connection."""
        opcode = first & 0x0F
        if opcode == _CONT:
            if not self._fragments:
                return self._fail(CloseCode.PROTOCOL_ERROR, "unexpected continuation frame")
        elif self._fragments:
            return self._fail(CloseCode.PROTOCOL_ERROR, "expected a continuation frame")
        else:
            self._text = opcode == _TEXT
        if not first & _FIN:
            self._fragments.append(data)
            return True
        if self._fragments:
            data = b"".join([*self._fragments, data])
            self._fragments = []
        message: str | bytes | bytearray = data
        if self._text:
            try:
                message = data.decode()
            except UnicodeDecodeError as e:
                return self._fail(CloseCode.INVALID_DATA, f"{e.reason} at position {e.start}")
        if self._receiver is None:
            self._early.append(message)
        else:
            self._receiver(message)
        return True

    def _other_frame(self, raw: bytes) -> bool:
        """A control frame, or bytes that are no valid data frame: websockets reads them (answers
        a ping, closes, fails the connection). False once the connection is no longer open."""
        super().data_received(raw)
        return self.protocol.state is State.OPEN

    def _fail(self, code: CloseCode, reason: str) -> bool:
        self.protocol.fail(code, reason)
        self.send_data()
        return False

    # ----------------------------------------------------------------------------------------
    # Writing

    def _check_open(self) -> None:
        state = self.protocol.state
        if state is not State.OPEN:
            close: Close | None = self.protocol.close_rcvd or self.protocol.close_sent
            raise NotConnected(f"the connection is {state.name.lower()}" + (f" ({close})" if close else ""))

    def _key(self) -> bytes:
        """A fresh masking key (RFC 6455 5.3: from a strong source of entropy, one per frame)."""
        at = self._key_at
        if at == len(self._keys):
            self._keys, at = os.urandom(4 * _KEYS), 0
        self._key_at = at + 4
        return self._keys[at : at + 4]

    def write_now(self, data: bytes, text: bool) -> bool:
        """Writes one whole message to the transport now; False (nothing written) while a large
        message is being written. Raises `NotConnected` unless the connection is open."""
        if self._sending is not None:
            return False
        self._check_open()
        key = self._key()
        self.transport.write(_header(_FIN | (_TEXT if text else _BINARY), len(data), key) + apply_mask(data, key))
        return True

    async def send_message(self, data: bytes, text: bool) -> None:
        """Writes one whole message, after any large one being written, and waits while the
        transport's buffer is full."""
        while not self.write_now(data, text):
            assert self._sending is not None
            await asyncio.shield(self._sending)
        if self.paused:
            await self.drain()

    async def send_binary(self, head: bytes, body: memoryview) -> None:
        """Writes one binary message, `head` then `body`, as one frame without joining them:
        `head` is masked on its own and `body` in blocks of `FRAGMENT` bytes (views of it), each
        block written as soon as it is masked. Between blocks it waits while the transport's
        buffer is full; meanwhile nothing else goes into the frame: other messages wait, and the
        control frames websockets writes are held (`send_data`) until the frame is whole."""
        while self._sending is not None:
            await asyncio.shield(self._sending)
        self._check_open()
        key = self._key()
        # The key as it applies from the body's first byte on (blocks are multiples of 4 bytes).
        shift = len(head) % 4
        body_key = key[shift:] + key[:shift]
        self._writer.write(
            (
                _header(_FIN | _BINARY, len(head) + len(body), key),
                apply_mask(head, key),
                apply_mask(body[:FRAGMENT], body_key),
            )
        )
        if len(body) > FRAGMENT:
            await self._send_rest(body, body_key)
        if self.paused:
            await self.drain()

    async def _send_rest(self, body: memoryview, key: bytes) -> None:
        """Writes the blocks of `body` after its first, masked with `key`."""
        self._sending = self.loop.create_future()
        self._watch_progress()
        at = FRAGMENT
        try:
            while at < len(body):
                if self.paused:
                    await self.drain()
                self._check_open()
                self.transport.write(apply_mask(body[at : at + FRAGMENT], key))
                at += FRAGMENT
                self._blocks += 1
        except BaseException:
            # A frame cut off leaves nothing the server could read after it, not even a close
            # frame: the connection is dropped, and the client reconnects.
            self.transport.abort()
            raise
        finally:
            if self._stalled is not None:
                self._stalled.cancel()
                self._stalled = None
            self._sending.set_result(None)
            self._sending = None
        self.send_data()

    def _watch_progress(self) -> None:
        """Drops the connection if no block of the frame being written goes out for
        `ping_timeout`: the keepalive ping, held until the frame is whole, cannot tell a dead peer
        meanwhile. Nothing when pings have no timeout."""
        if self.ping_timeout is None:
            return
        seen = self._blocks

        def check() -> None:
            self._stalled = None
            if self._sending is None:
                return
            if self._blocks == seen:
                self.transport.abort()
            else:
                self._watch_progress()

        self._stalled = self.loop.call_later(self.ping_timeout, check)

    async def ping(self, *args: Any, **kwargs: Any) -> Awaitable[float]:
        """websockets' ping, once the frame being written, if any, is whole: a ping cannot go
        inside it, and the wait for the pong starts when the ping is sent."""
        while self._sending is not None:
            await asyncio.shield(self._sending)
        return await super().ping(*args, **kwargs)

    def send_data(self) -> None:
        """Writes what websockets has to send (control frames, its closing handshake), unless a
        large message's frame is being written: then once it is whole."""
        if self._sending is None:
            super().send_data()


def _header(first: int, n: int, key: bytes) -> bytes:
    """The header of a client frame of `n` payload bytes (`first`: FIN and opcode), with its
    masking key."""
    if n < 126:
        return struct.pack("!BB", first, 0x80 | n) + key
    if n < 65536:
        return struct.pack("!BBH", first, 0xFE, n) + key
    return struct.pack("!BBQ", first, 0xFF, n) + key


class _Writer:
    """Writes several buffers to a transport as one, without joining them: through the
    transport's `writelines` where it writes them as they are (uvloop's, asyncio's from Python
    3.12), else, on asyncio's plain socket transport with nothing buffered, in one `writev` on its
    socket, the transport taking what the socket did not; else joined."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.write: Callable[[tuple[bytes, ...]], None] = self._join
        if type(transport).writelines is not asyncio.WriteTransport.writelines:
            self.write = transport.writelines
            return
        sock = transport.get_extra_info("socket")
        if _PlainTransport is not None and isinstance(transport, _PlainTransport) and sock is not None:
            self._sock = sock
            self.write = self._writev

    def _join(self, parts: tuple[bytes, ...]) -> None:
        self._transport.write(b"".join(parts))

    def _writev(self, parts: tuple[bytes, ...]) -> None:
        transport = self._transport
        fd = self._sock.fileno()
        if fd < 0 or transport.is_closing() or transport.get_write_buffer_size():
            self._join(parts)
            return
        try:
            n = os.writev(fd, parts)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self._join(parts)  # the transport meets the error again and closes as it does
            return
        for part in parts:
            if n >= len(part):
                n -= len(part)
                continue
            transport.write(memoryview(part)[n:])
            n = 0


_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)


class _Reads(asyncio.BufferedProtocol):
    """What the transport calls: the connection's reading, closing and flow control, as a
    `BufferedProtocol` only."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._connection.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._connection.buffer_updated(nbytes)

    def eof_received(self) -> None:
        self._connection.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection.connection_lost(exc)

    def pause_writing(self) -> None:
        self._connection.pause_writing()

    def resume_writing(self) -> None:
        self._connection.resume_writing()
