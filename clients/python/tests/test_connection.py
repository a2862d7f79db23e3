"""The connection and its frame reader (herald_client/_connection.py, _reader.py): frames read as
websockets parses them whatever the chunks they arrive in, large payloads land in buffers of their
own that are used again only once nothing refers to them, the client reads data frames once the
handshake is done while websockets still answers pings, closes and fails the connection on a bad
frame, messages are handed over whole and written as masked frames websockets parses back, and
the installed websockets is one these apply to (a websockets whose internals changed is caught
here)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys

import pytest
from conftest import Herald, run_async, within
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import Protocol, State
from websockets.streams import StreamReader
from websockets.uri import parse_uri
from websockets.utils import accept_key

import herald_client
from herald_client import NotConnected
from herald_client._connection import FRAGMENT, Connection, _Writer
from herald_client._reader import LARGE, BoundaryReader, BufferPool, FrameReader

CPYTHON_GIL = sys.implementation.name == "cpython" and bool(getattr(sys, "_is_gil_enabled", lambda: True)())

Shape = tuple[Opcode, bool, bytes]


def read_all(wire: bytes, chunks: list[int], into_space: bool) -> list[Shape]:
    """Feeds `wire` to a `FrameReader` in pieces of the sizes in `chunks` (cycled). With
    `into_space`, bytes the reader has room for in a large payload's buffer are written there, as
    the connection has the kernel do. Data frames and the others (each parsed by websockets from
    the bytes handed on, which must be one whole frame) in the order they came."""
    frames: list[Shape] = []

    def on_data(first: int, payload: bytes | bytearray) -> bool:
        # A large payload is a buffer of its own, the size of the payload.
        assert type(payload) is (bytearray if len(payload) >= LARGE else bytes)
        frames.append((Opcode(first & 0x0F), bool(first & 0x80), bytes(payload)))
        return True

    def on_other(raw: bytes) -> bool:
        reader = StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        parse = Frame.parse(reader.read_exact, mask=False)
        with pytest.raises(StopIteration) as done:
            next(parse)
        assert not reader.buffer
        frames.append(shape([done.value.value])[0])
        return True

    frames_reader = FrameReader(BufferPool(), on_data, on_other)
    at, i = 0, 0
    while at < len(wire):
        n = chunks[i % len(chunks)]
        space = frames_reader.space() if into_space else None
        if space is not None:
            n = min(n, len(space), len(wire) - at)
            space[:n] = wire[at : at + n]
            frames_reader.filled(n)
        else:
            frames_reader.feed(memoryview(wire[at : at + n]))
        at, i = at + n, i + 1
    return frames


def shape(frames: list[Frame]) -> list[Shape]:
    return [(f.opcode, f.fin, bytes(f.data)) for f in frames]


def test_large_and_small_frames_in_any_chunks_read_as_websockets_parses_them() -> None:
    rng = random.Random(5)
    sent = [
        Frame(Opcode.TEXT, b'{"op":"pong"}'),
        Frame(Opcode.BINARY, os.urandom(LARGE), fin=False),
        Frame(Opcode.PING, b"are you there"),
        Frame(Opcode.CONT, os.urandom(3 * LARGE + 17)),
        Frame(Opcode.BINARY, os.urandom(LARGE - 1)),
        Frame(Opcode.BINARY, b""),
        Frame(Opcode.PONG, b""),
        Frame(Opcode.BINARY, os.urandom(2 * LARGE)),
        Frame(Opcode.TEXT, b"x" * 100),
        Frame(Opcode.BINARY, os.urandom(300)),
        Frame(Opcode.CLOSE, b"\x03\xe8bye"),
    ]
    wire = b"".join(f.serialize(mask=False) for f in sent)
    every = [
        [256 * 1024],
        [64 * 1024],  # what the connection reads at most outside a large payload
        [1, 1, 1, 3 * 65536 + 5],  # a few bytes at a time, then larger
        [LARGE - 3, 7],
        [rng.randrange(1, 300_000) for _ in range(50)],
        [rng.randrange(1, 20) for _ in range(50)],
        [len(wire)],  # all at once
    ]
    for chunks in every:
        for into_space in (False, True):
            assert read_all(wire, chunks, into_space) == shape(sent)


@pytest.mark.skipif(not CPYTHON_GIL, reason="buffers are reused only where reference counts are exact")
def test_the_pool_lends_a_buffer_again_only_once_nothing_refers_to_it() -> None:
    pool = BufferPool(size=2)
    a = pool.take(1000)
    b = pool.take(1000)
    a_id, b_id = id(a), id(b)
    assert b is not a
    view = memoryview(a)
    del a
    c = pool.take(1000)  # a view of the first is left, the second is held: a new one
    assert id(c) not in (a_id, b_id)
    view.release()
    del view, c
    d = pool.take(900)  # the first, resized to what is asked
    assert id(d) == a_id and len(d) == 900
    del b
    e = pool.take(5000)  # the second, grown
    assert id(e) == b_id and len(e) == 5000


@run_async()
async def test_the_installed_websockets_gets_the_connection_and_the_frame_reader(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        ws = h._ws
        assert isinstance(ws, Connection)
        protocol: Protocol = ws.protocol
        assert type(protocol.reader) is BoundaryReader
        # The transport reads through get_buffer (a BufferedProtocol only, on asyncio and uvloop alike):
        # large payloads land in place.
        protocol_seen = ws.transport.get_protocol()
        assert isinstance(protocol_seen, asyncio.BufferedProtocol) and not isinstance(protocol_seen, asyncio.Protocol)
        sub = await h.subscribe("reader/big")
        # herald answered the first request: from then on the client's reader reads.
        assert ws._own
        payload = os.urandom(5 * LARGE + 3)
        text = "é" * (LARGE // 2 + 1000)  # a text frame over LARGE bytes
        await h.publish("reader/big", payload)
        await h.publish("reader/big", b"small")
        await h.publish("reader/big", text)
        m = await within(sub.__anext__())
        assert m.data == payload
        assert (await within(sub.__anext__())).data == b"small"
        assert (await within(sub.__anext__())).data == text
        # websockets still answers pings and sees pongs: its keepalive round trip completes.
        pong = await ws.ping()
        assert await within(pong) >= 0


@run_async()
async def test_a_payload_kept_is_never_overwritten_and_one_dropped_is_read_into_again(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h, herald_client.connect(herald.url) as publisher:
        # One image at a time, as a subscriber that keeps up sees them.
        sub = await h.subscribe("reader/reuse", policy="lossless", window=1)
        images = [bytes([i]) * (LARGE * 3) for i in range(12)]
        for image in images:
            await publisher.publish("reader/reuse", image, ack=False)
        kept = await within(sub.__anext__())
        view = kept.payload  # a view of the first payload, and the message, both kept
        ids = set()
        for image in images[1:]:
            m = await within(sub.__anext__())
            assert m.data == image
            ids.add(id(m.payload.obj))
            del m
        assert bytes(view) == images[0] and kept.data == images[0]
        assert view.readonly
        if CPYTHON_GIL:
            # The others took turns in the pool's buffers (the one kept aside).
            assert len(ids) <= 3 and id(view.obj) not in ids


@run_async()
async def test_a_message_in_several_frames_reaches_the_receiver_whole_and_bad_utf8_fails_the_connection() -> None:
    written: list[bytes] = []
    ws = open_connection(written)
    got: list[str | bytes | bytearray] = []
    ws.process_event(Frame(Opcode.TEXT, '{"op":"pong","x":"é'.encode()[:-1], fin=False))  # é split
    ws.attach(got.append)
    ws.process_event(Frame(Opcode.CONT, b"\xa9", fin=False))
    ws.process_event(Frame(Opcode.CONT, b'"}'))
    ws.process_event(Frame(Opcode.BINARY, b"\x00\x01"))
    assert got == ['{"op":"pong","x":"é"}', b"\x00\x01"]
    ws.process_event(Frame(Opcode.TEXT, b"\xff"))
    assert len(got) == 2 and ws.protocol.state is State.CLOSING
    assert ws.protocol.close_sent is not None and ws.protocol.close_sent.code == CloseCode.INVALID_DATA
    assert written and written[0][0] == 0x88  # the close frame went out


@run_async()
async def test_what_the_connection_writes_is_masked_frames_of_the_messages() -> None:
    written: list[bytes] = []
    ws = open_connection(written)
    big = os.urandom(3 * FRAGMENT + 5)
    assert ws.write_now(b'{"op":"ping"}', text=True)
    assert ws.write_now(bytes(200), text=False)
    await ws.send_message(os.urandom(70_000), text=False)
    # Headers of each length modulo 4: the body's blocks are masked on from where the head ends.
    for head in (b"head", b"heads", b"header", b"headers"):
        await ws.send_binary(head, memoryview(big))
    await ws.send_binary(b"alone", memoryview(b""))
    await ws.send_binary(b"small", memoryview(b"body"))
    frames = parse_written(written)
    assert [(f.opcode, f.fin, len(f.data)) for f in frames] == [
        (Opcode.TEXT, True, 13),
        (Opcode.BINARY, True, 200),
        (Opcode.BINARY, True, 70_000),
        (Opcode.BINARY, True, 4 + len(big)),
        (Opcode.BINARY, True, 5 + len(big)),
        (Opcode.BINARY, True, 6 + len(big)),
        (Opcode.BINARY, True, 7 + len(big)),
        (Opcode.BINARY, True, 5),
        (Opcode.BINARY, True, 9),
    ]
    assert frames[0].data == b'{"op":"ping"}'
    assert [f.data for f in frames[3:]] == [
        b"head" + big,
        b"heads" + big,
        b"header" + big,
        b"headers" + big,
        b"alone",
        b"smallbody",
    ]
    # Every frame has a masking key of its own.
    assert len({bytes(f) for f in masking_keys(b"".join(written))}) == len(frames)


def parse_written(written: list[bytes]) -> list[Frame]:
    """The client frames in what a connection wrote, unmasked."""
    reader = StreamReader()
    reader.feed_data(b"".join(written))
    reader.feed_eof()
    frames = []
    while reader.buffer:
        parse = Frame.parse(reader.read_exact, mask=True)
        with pytest.raises(StopIteration) as done:
            next(parse)
        frames.append(done.value.value)
    return frames


def masking_keys(wire: bytes) -> list[bytes]:
    """The masking key of each client frame in `wire`."""
    keys, at = [], 0
    while at < len(wire):
        n, start = wire[at + 1] & 0x7F, at + 2
        if n == 126:
            n, start = int.from_bytes(wire[start : start + 2], "big"), start + 2
        elif n == 127:
            n, start = int.from_bytes(wire[start : start + 8], "big"), start + 8
        keys.append(wire[start : start + 4])
        at = start + 4 + n
    return keys


@run_async()
async def test_control_frames_wait_for_a_large_frame_being_written_and_a_cut_frame_drops_the_connection() -> None:
    written: list[bytes] = []
    ws = open_connection(written)
    transport = fake(ws)
    big = os.urandom(3 * FRAGMENT)
    ws.pause_writing()  # the transport's buffer is full: the frame waits after its first block
    sending = asyncio.ensure_future(ws.send_binary(b"h", memoryview(big)))
    await asyncio.sleep(0)
    assert ws._sending is not None
    ws.protocol.send_pong(b"hi")
    ws.send_data()  # as websockets answers herald's ping: held while the frame is being written
    # A keepalive ping waits to be sent, and the wait for its pong starts only then.
    pinging = asyncio.ensure_future(ws.ping(b"ka"))
    await asyncio.sleep(0)
    assert not pinging.done()
    assert not ws.write_now(b"{}", text=True)  # a credit waits too
    await asyncio.sleep(0.1)
    ws.resume_writing()
    await sending
    pong = await pinging
    ws.process_event(Frame(Opcode.PONG, b"ka"))
    assert await pong < 0.05  # the latency from when the ping went, not from when it was asked
    frames = parse_written(written)
    assert [(f.opcode, bytes(f.data)) for f in frames] == [
        (Opcode.BINARY, b"h" + big),
        (Opcode.PONG, b"hi"),
        (Opcode.PING, b"ka"),
    ]
    # Cancelled while waiting between its blocks, the frame is cut: no frame could follow it,
    # so the connection is dropped.
    ws.pause_writing()
    sending = asyncio.ensure_future(ws.send_binary(b"h", memoryview(big)))
    await asyncio.sleep(0)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert transport.aborted and ws._sending is None


@run_async()
async def test_a_large_frame_that_stops_going_out_drops_the_connection_after_the_ping_timeout() -> None:
    written: list[bytes] = []
    ws = open_connection(written)
    transport = fake(ws)
    ws.ping_timeout = 0.2
    big = memoryview(os.urandom(4 * FRAGMENT))
    # Slow but going: a block every 0.1 s, each filling the transport's buffer, keeps the connection.
    transport.fills = True
    sending = asyncio.ensure_future(ws.send_binary(b"h", big))
    for _ in range(4):
        await asyncio.sleep(0.1)
        ws.resume_writing()
    await within(sending)
    assert not transport.aborted
    transport.fills = False
    # Stopped: dropped once nothing went out for the ping timeout.
    ws.pause_writing()
    sending = asyncio.ensure_future(ws.send_binary(b"h", big))
    await asyncio.sleep(0.1)
    assert not transport.aborted
    await asyncio.sleep(0.2)
    assert transport.aborted
    ws.protocol.state = State.CLOSED  # as once the transport reported the connection lost
    ws.resume_writing()
    with pytest.raises(NotConnected):
        await within(sending)


@run_async()
async def test_parts_written_together_arrive_whole_and_in_order_when_the_socket_takes_only_some() -> None:
    received = bytearray()
    done = asyncio.Event()
    expected = 0

    async def collect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(received) < expected:
            await asyncio.sleep(0.01)  # the writer's socket fills meanwhile
            received.extend(await reader.read(1 << 20))
        done.set()
        writer.close()

    server = await asyncio.start_server(collect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=sock)
    writer = _Writer(transport)
    parts = [(os.urandom(14), os.urandom(300_000), os.urandom(3)) for _ in range(4)]
    wire = b"".join(b"".join(p) + b"between" for p in parts)
    expected = len(wire)
    for p in parts:
        writer.write(p)
        transport.write(b"between")  # behind what the socket did not take
    await within(done.wait())
    assert bytes(received) == wire
    transport.close()
    server.close()
    await server.wait_closed()


def receive(ws: Connection, wire: bytes, chunk: int = 1000) -> None:
    """`wire` from the socket, read as the transport reads: into `get_buffer()`, `chunk` bytes at
    most at a time."""
    at = 0
    while at < len(wire):
        space = ws.get_buffer(-1)
        n = min(chunk, len(space), len(wire) - at)
        space[:n] = wire[at : at + n]
        ws.buffer_updated(n)
        at += n


def handshaken(written: list[bytes]) -> Connection:
    """A connection whose handshake's response came through `buffer_updated`."""
    protocol = ClientProtocol(parse_uri("ws://127.0.0.1/ws"))
    request = protocol.connect()
    protocol.send_request(request)
    ws = Connection(protocol)
    ws.connection_made(Transport(written))
    key = accept_key(request.headers["Sec-WebSocket-Key"])
    response = (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {key}\r\n\r\n"
    )
    receive(ws, response.encode())
    assert ws.protocol.state is State.OPEN
    return ws


@run_async()
async def test_after_the_handshake_the_client_reads_data_frames_and_websockets_the_rest() -> None:
    written: list[bytes] = []
    ws = handshaken(written)
    got: list[str | bytes | bytearray] = []
    ws.attach(got.append)
    big = os.urandom(2 * LARGE + 5)
    wire = b"".join(
        f.serialize(mask=False)
        for f in [
            Frame(Opcode.TEXT, b'{"op":"pong"}'),
            Frame(Opcode.BINARY, big[:1000], fin=False),
            Frame(Opcode.PING, b"hi"),
            Frame(Opcode.CONT, big[1000:]),
        ]
    )
    receive(ws, wire, chunk=777)
    assert ws._own
    assert got == ['{"op":"pong"}', big]
    # websockets answered the ping, masked, with its payload.
    assert written and written[-1][0] == 0x8A and len(written[-1]) == 2 + 4 + 2
    # A continuation without a start fails the connection; what follows goes to websockets.
    receive(ws, Frame(Opcode.CONT, b"x").serialize(mask=False) + Frame(Opcode.TEXT, b"late").serialize(mask=False))
    assert ws.protocol.state is State.CLOSING and got == ['{"op":"pong"}', big]
    assert ws.protocol.close_sent is not None and ws.protocol.close_sent.code == CloseCode.PROTOCOL_ERROR


@run_async()
async def test_a_masked_frame_from_the_server_fails_the_connection_and_a_close_is_answered() -> None:
    written: list[bytes] = []
    ws = handshaken(written)
    receive(ws, Frame(Opcode.BINARY, b"x" * 10).serialize(mask=True))
    assert ws.protocol.state is State.CLOSING
    assert ws.protocol.close_sent is not None and ws.protocol.close_sent.code == CloseCode.PROTOCOL_ERROR
    written.clear()
    ws = handshaken(written)
    receive(
        ws, Frame(Opcode.TEXT, b"{}").serialize(mask=False) + Frame(Opcode.CLOSE, b"\x03\xe8").serialize(mask=False)
    )
    assert ws.protocol.state is State.CLOSING and ws.protocol.close_rcvd is not None
    assert written and written[-1][0] == 0x88  # the close echoed


def fake(ws: Connection) -> Transport:
    """The test transport `ws` writes to."""
    assert isinstance(ws.transport, Transport)
    return ws.transport


def open_connection(written: list[bytes]) -> Connection:
    """A connection as after the handshake, writing into `written`."""
    ws = Connection(ClientProtocol(parse_uri("ws://127.0.0.1/ws")))
    ws.connection_made(Transport(written))
    ws.protocol.state = State.OPEN
    ws.response = Response(101, "Switching Protocols", Headers())
    return ws


class Transport(asyncio.Transport):
    """Keeps what is written, and whether it was aborted."""

    def __init__(self, written: list[bytes]) -> None:
        super().__init__()
        self.written = written
        self.aborted = False
        # Whether each write fills the buffer (pauses the protocol).
        self.fills = False

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))
        if self.fills:
            self.protocol.pause_writing()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass
