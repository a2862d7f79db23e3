"""A VBDS client written from the VBDS API description only (shared/reference/seed-systems.md,
seed 001), run against herald's VBDS compatibility endpoints:

- `GET/POST/DELETE /vbds/admin/streams[/{name}]`,
- `POST /vbds/transfer/streams/{name}` with a multipart field `data` (202 once delivered),
- WebSocket `/vbds/access/streams/{name}`: an image is binary messages then a one-byte `\\n`
  message; the client sends one message back per image as its acknowledgement.

By default a stream keeps VBDS's semantics (every image to every subscriber, each acknowledged,
the publisher waiting), bounded: a subscriber that stops acknowledging is closed (4008) after
`lossless_hold_timeout_ms`. `?lossless=false` streams fix VBDS's flaw instead: a slow subscriber
skips to the newest image instead of slowing the publisher and the other subscribers.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tempfile
import time

import pytest
import requests
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from test_protocol import Herald, run_async

STEP = 10.0


@pytest.fixture(scope="module")
def herald():
    server = Herald()
    yield server
    server.stop_and_check()


def image(index: int, size: int = 300_001) -> bytes:
    """An image whose content depends on its index (odd size: chunking edge cases)."""
    return bytes((index * 7 + i) % 251 for i in range(size))


def post_image(server: Herald, stream: str, data: bytes) -> int:
    r = requests.post(
        f"{server.http}/vbds/transfer/streams/{stream}",
        files={"data": ("image.fits", data, "image/fits")},
        timeout=STEP,
    )
    return r.status_code


class VbdsClient:
    """Receives whole images, acknowledging each after `delay` seconds."""

    def __init__(self, server: Herald, stream: str, delay: float):
        self.url = f"ws://127.0.0.1:{server.port}/vbds/access/streams/{stream}"
        self.delay = delay
        self.images: list[bytes] = []
        self.one_byte_data_chunks = 0

    async def run(self, until: int, ready: asyncio.Event):
        async with ws_connect(self.url, max_size=None) as ws:
            ready.set()
            parts: list[bytes] = []
            while True:
                msg = await asyncio.wait_for(ws.recv(), STEP)
                if len(msg) == 1 and msg in (b"\n", "\n"):
                    self.images.append(b"".join(parts))
                    parts = []
                    await asyncio.sleep(self.delay)
                    await ws.send("ack")
                    if image_index(self.images[-1]) == until:
                        return
                else:
                    assert isinstance(msg, bytes)
                    parts.append(msg)


def image_index(data: bytes) -> int:
    for index in range(1000):
        if data[:16] == image(index, 16):
            return index
    raise AssertionError("not one of the published images")


def test_admin_streams_list_create_delete(herald):
    """Answers as VBDS's admin and transfer routes do: the stream as JSON on create and delete,
    409 for a second create, 404 for deleting a missing one, 400 for publishing to one."""
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.get(base, timeout=STEP).json() == []
    created = requests.post(f"{base}/admin1?contentType=image/fits", timeout=STEP)
    assert created.status_code == 200
    assert created.json() == {"name": "admin1", "contentType": "image/fits"}
    assert requests.post(f"{base}/admin1?contentType=image/fits", timeout=STEP).status_code == 409
    assert requests.get(base, timeout=STEP).json() == [{"name": "admin1", "contentType": "image/fits"}]
    deleted = requests.delete(f"{base}/admin1", timeout=STEP)
    assert deleted.status_code == 200
    assert deleted.json() == {"name": "admin1", "contentType": "image/fits"}
    assert requests.delete(f"{base}/admin1", timeout=STEP).status_code == 404
    assert requests.get(base, timeout=STEP).json() == []
    assert post_image(herald, "admin1", b"xx") == 400


@run_async
async def test_deleting_a_stream_leaves_its_subscribers_connected(herald):
    """As with VBDS, whose clients take a closed socket for an error: a subscriber of a deleted
    stream stays connected, receives nothing, and gets the images of a stream of that name
    created again."""
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.post(f"{base}/gone?contentType=image/fits", timeout=STEP).status_code == 200
    url = f"ws://127.0.0.1:{herald.port}/vbds/access/streams/gone"
    async with ws_connect(url, max_size=None) as ws:
        await asyncio.sleep(0.2)  # the server registers the subscriber after the handshake
        assert await asyncio.to_thread(post_image, herald, "gone", image(1)) == 202
        parts = []
        while (msg := await asyncio.wait_for(ws.recv(), STEP)) != b"\n":
            parts.append(msg)
        assert b"".join(parts) == image(1)
        await ws.send("ack")
        assert requests.delete(f"{base}/gone", timeout=STEP).status_code == 200
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ws.recv(), 0.5)
        assert ws.close_code is None
        assert requests.post(f"{base}/gone?contentType=image/fits", timeout=STEP).status_code == 200
        assert await asyncio.to_thread(post_image, herald, "gone", image(2)) == 202
        parts = []
        while (msg := await asyncio.wait_for(ws.recv(), STEP)) != b"\n":
            parts.append(msg)
        assert b"".join(parts) == image(2)


@run_async
async def test_a_slow_subscriber_skips_to_the_newest_and_slows_no_one(herald):
    created = requests.post(
        f"{herald.http}/vbds/admin/streams/cam?contentType=image/fits&lossless=false", timeout=STEP
    )
    assert created.status_code == 200
    count = 12
    fast = VbdsClient(herald, "cam", 0.0)
    slow = VbdsClient(herald, "cam", 0.5)
    ready = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(c.run(count - 1, r)) for c, r in zip((fast, slow), ready)]
    # A native herald subscriber on the stream's topic sees the same images.
    native = await ws_connect(herald.ws_url, max_size=None)
    await native.send(json.dumps({"op": "sub", "topic": "vbds/cam"}))
    assert json.loads(await asyncio.wait_for(native.recv(), STEP))["op"] == "subscribed"
    for r in ready:
        await asyncio.wait_for(r.wait(), STEP)
    await asyncio.sleep(0.2)  # the server registers the subscribers after the handshake
    started = time.monotonic()
    for i in range(count):
        assert await asyncio.to_thread(post_image, herald, "cam", image(i)) == 202
    publish_secs = time.monotonic() - started
    await asyncio.wait_for(asyncio.gather(*tasks), STEP)
    assert fast.images == [image(i) for i in range(count)]
    got = [image_index(img) for img in slow.images]
    assert all(img == image(i) for img, i in zip(slow.images, got)), "whole images only"
    assert got == sorted(set(got)) and got[-1] == count - 1, got
    assert len(got) < count, "the slow subscriber skipped images"
    # Had the slow subscriber held the publisher, 12 images would take 12 × 0.5 s.
    assert publish_secs < 3.0, publish_secs
    for i in range(count):
        frame = await asyncio.wait_for(native.recv(), STEP)
        (n,) = struct.unpack(">I", frame[:4])
        header = json.loads(frame[4 : 4 + n])
        assert (header["topic"], header["seq"], header["ct"]) == ("vbds/cam", i + 1, "image/fits")
        assert frame[4 + n :] == image(i)
    await native.close()


@run_async
async def test_a_stream_keeps_vbds_semantics_by_default(herald):
    """Created exactly as VBDS's README says (no option): every image, in order, each publish
    waiting for the acknowledgement of the one before."""
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.post(f"{base}/exact?contentType=image/fits", timeout=STEP).status_code == 200
    count = 4
    client = VbdsClient(herald, "exact", 0.3)
    ready = asyncio.Event()
    task = asyncio.create_task(client.run(count - 1, ready))
    await asyncio.wait_for(ready.wait(), STEP)
    await asyncio.sleep(0.2)
    started = time.monotonic()
    for i in range(count):
        assert await asyncio.to_thread(post_image, herald, "exact", image(i, 1000)) == 202
    publish_secs = time.monotonic() - started
    await asyncio.wait_for(task, STEP)
    assert client.images == [image(i, 1000) for i in range(count)], "every image, in order"
    # Each publish after the first waits for the acknowledgement of the one before.
    assert publish_secs >= 0.3 * (count - 1) - 0.1, publish_secs


@run_async
async def test_back_to_back_large_images_all_arrive(herald):
    """Six 2048 x 2048 x 2-byte images published back to back reach a VBDS client whole, every
    one (VBDS's own semantics: nothing skipped)."""
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.post(f"{base}/burst?contentType=image/fits", timeout=STEP).status_code == 200
    size = 2048 * 2048 * 2
    frames = [bytes([i]) * 16 + bytes(size - 16) for i in range(6)]
    url = f"ws://127.0.0.1:{herald.port}/vbds/access/streams/burst"
    async with ws_connect(url, max_size=None) as ws:
        await asyncio.sleep(0.2)

        def publish_all():
            return [post_image(herald, "burst", f) for f in frames]

        publisher = asyncio.create_task(asyncio.to_thread(publish_all))
        got = []
        parts: list[bytes] = []
        while len(got) < len(frames):
            msg = await asyncio.wait_for(ws.recv(), STEP)
            if msg == b"\n":
                got.append(b"".join(parts))
                parts = []
                await ws.send("ack")
            else:
                parts.append(msg)
        assert await asyncio.wait_for(publisher, STEP) == [202] * 6
        assert [g[0] for g in got] == list(range(6))
        assert got == frames


def test_a_subscriber_that_stops_acknowledging_is_closed_and_the_camera_goes_on():
    """A display that never acknowledges holds each publish at most the hold timeout once: it is
    then closed with 4008, and later publishes are not held at all."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write("lossless_hold_timeout_ms = 1000\n")
        config = f.name
    server = Herald("--config", config)
    try:
        base = f"{server.http}/vbds/admin/streams"
        assert requests.post(f"{base}/hung?contentType=image/fits", timeout=STEP).status_code == 200

        async def body():
            url = f"ws://127.0.0.1:{server.port}/vbds/access/streams/hung"
            async with ws_connect(url, max_size=None) as ws:
                await asyncio.sleep(0.2)
                assert await asyncio.to_thread(post_image, server, "hung", image(1, 1000)) == 202
                while await asyncio.wait_for(ws.recv(), STEP) != b"\n":
                    pass
                # No acknowledgement: the next publish waits the hold timeout, then goes on.
                started = time.monotonic()
                assert await asyncio.to_thread(post_image, server, "hung", image(2, 1000)) == 202
                assert 0.8 <= time.monotonic() - started < 4.0
                with pytest.raises(ConnectionClosed):
                    while True:
                        await asyncio.wait_for(ws.recv(), STEP)
                assert ws.close_code == 4008, (ws.close_code, ws.close_reason)
                assert ws.close_reason.startswith("slow consumer")
            started = time.monotonic()
            for i in range(3, 6):
                assert await asyncio.to_thread(post_image, server, "hung", image(i, 1000)) == 202
            assert time.monotonic() - started < 1.0

        asyncio.run(asyncio.wait_for(body(), 30))
    finally:
        server.stop_and_check()
        os.unlink(config)
