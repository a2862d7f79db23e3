"""The large-frame reader (herald_client/_reader.py): the frames websockets parses through it are
the ones it parses through its own reader, whatever the chunks they arrive in; and the installed
websockets is one it applies to (a websockets whose internals changed would be caught here)."""

from __future__ import annotations

import os
import random
from collections.abc import Generator

import pytest
from conftest import Herald, run_async, within
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol
from websockets.streams import StreamReader

import herald_client
from herald_client._reader import LARGE, LargeFrameReader


def parse_all(reader: StreamReader, wire: bytes, chunks: list[int]) -> list[Frame]:
    """Feeds `wire` to `reader` in pieces of the sizes in `chunks` (cycled), parsing frames."""
    frames: list[Frame] = []

    def parser() -> Generator[None, None, None]:
        while True:
            frame = yield from Frame.parse(reader.read_exact, mask=False)
            frames.append(frame)

    gen = parser()
    next(gen)
    at, i = 0, 0
    while at < len(wire):
        n = chunks[i % len(chunks)]
        reader.feed_data(wire[at : at + n])
        next(gen)
        at, i = at + n, i + 1
    return frames


def test_large_and_small_frames_in_any_chunks_parse_as_websockets_own_reader_does() -> None:
    rng = random.Random(5)
    sent = [
        Frame(Opcode.TEXT, b'{"op":"pong"}'),
        Frame(Opcode.BINARY, os.urandom(LARGE), fin=False),
        Frame(Opcode.CONT, os.urandom(3 * LARGE + 17)),
        Frame(Opcode.BINARY, os.urandom(LARGE - 1)),
        Frame(Opcode.BINARY, b""),
        Frame(Opcode.BINARY, os.urandom(2 * LARGE)),
        Frame(Opcode.TEXT, b"x" * 100),
    ]
    wire = b"".join(f.serialize(mask=False) for f in sent)
    every = [
        [256 * 1024],  # what asyncio's transport reads at most
        [1, 1, 1, 3 * 65536 + 5],  # a few bytes at a time, then larger
        [LARGE - 3, 7],
        [rng.randrange(1, 300_000) for _ in range(50)],
        [len(wire)],  # all at once
    ]
    for chunks in every:
        theirs = parse_all(StreamReader(), wire, chunks)
        ours = parse_all(LargeFrameReader(), wire, chunks)
        assert [(f.opcode, f.fin, bytes(f.data)) for f in ours] == [(f.opcode, f.fin, bytes(f.data)) for f in theirs]
        assert [(f.opcode, f.fin, f.data) for f in ours] == [(f.opcode, f.fin, f.data) for f in sent]
        # A large payload is `bytes`: websockets' assembler passes a whole one on without a copy.
        assert all(isinstance(f.data, bytes) for f in ours if len(f.data) >= LARGE)


def test_the_stream_ending_inside_a_large_frame_is_an_eof_error() -> None:
    reader = LargeFrameReader()
    wire = Frame(Opcode.BINARY, bytes(2 * LARGE)).serialize(mask=False)
    gen = Frame.parse(reader.read_exact, mask=False)
    next(gen)
    reader.feed_data(wire[: LARGE + 10])
    next(gen)
    reader.feed_eof()
    with pytest.raises(EOFError):
        next(gen)


@run_async()
async def test_the_installed_websockets_gets_the_large_frame_reader(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        ws = h._ws
        assert ws is not None
        protocol: Protocol = ws.protocol
        assert type(protocol.reader) is LargeFrameReader
        sub = await h.subscribe("reader/big")
        payload = os.urandom(5 * LARGE + 3)
        text = "é" * (LARGE // 2 + 1000)  # a text frame over LARGE bytes
        await h.publish("reader/big", payload)
        await h.publish("reader/big", b"small")
        await h.publish("reader/big", text)
        m = await within(sub.__anext__())
        assert m.data == payload
        assert (await within(sub.__anext__())).data == b"small"
        assert (await within(sub.__anext__())).data == text
