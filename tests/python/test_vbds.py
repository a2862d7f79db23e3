"""A VBDS client written from the VBDS API description only (shared/reference/seed-systems.md,
seed 001), run against herald's VBDS compatibility endpoints:

- `GET/POST/DELETE /vbds/admin/streams[/{name}]`,
- `POST /vbds/transfer/streams/{name}` with a multipart field `data` (202 once delivered),
- WebSocket `/vbds/access/streams/{name}`: an image is binary messages then a one-byte `\\n`
  message; the client sends one message back per image as its acknowledgement.

Plus herald's fix of VBDS's flaw: a slow subscriber skips to the newest image instead of slowing
the publisher and the other subscribers; `?lossless=true` streams keep VBDS's exact semantics.
"""

from __future__ import annotations

import asyncio
import json
import struct
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
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.get(base, timeout=STEP).json() == []
    assert requests.post(f"{base}/admin1?contentType=image/fits", timeout=STEP).status_code == 200
    assert requests.post(f"{base}/admin1?contentType=image/fits", timeout=STEP).status_code == 409
    assert requests.get(base, timeout=STEP).json() == [{"name": "admin1", "contentType": "image/fits"}]
    assert requests.delete(f"{base}/admin1", timeout=STEP).status_code == 200
    assert requests.delete(f"{base}/admin1", timeout=STEP).status_code == 404
    assert requests.get(base, timeout=STEP).json() == []
    assert post_image(herald, "admin1", b"xx") == 404


@run_async
async def test_deleting_a_stream_closes_its_subscribers(herald):
    """A subscriber idle between images and one that has not acknowledged its image yet are both
    told, with a close 1001, once their stream is deleted; the busy one gets its image whole."""
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.post(f"{base}/gone?contentType=image/fits", timeout=STEP).status_code == 200
    url = f"ws://127.0.0.1:{herald.port}/vbds/access/streams/gone"
    async with ws_connect(url, max_size=None) as busy, ws_connect(url, max_size=None) as idle:
        await asyncio.sleep(0.2)  # the server registers the subscribers after the handshake
        assert await asyncio.to_thread(post_image, herald, "gone", image(1)) == 202
        parts = []
        while (msg := await asyncio.wait_for(busy.recv(), STEP)) != b"\n":
            parts.append(msg)
        assert b"".join(parts) == image(1)
        # `idle` acknowledges its image; `busy` does not.
        while await asyncio.wait_for(idle.recv(), STEP) != b"\n":
            pass
        await idle.send("ack")
        await asyncio.sleep(0.1)
        assert requests.delete(f"{base}/gone", timeout=STEP).status_code == 200
        for ws in (busy, idle):
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), STEP)
            assert ws.close_code == 1001
            assert ws.close_reason == "stream gone deleted"


@run_async
async def test_a_slow_subscriber_skips_to_the_newest_and_slows_no_one(herald):
    assert requests.post(f"{herald.http}/vbds/admin/streams/cam?contentType=image/fits", timeout=STEP).status_code == 200
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
async def test_a_lossless_stream_keeps_vbds_semantics(herald):
    base = f"{herald.http}/vbds/admin/streams"
    assert requests.post(f"{base}/exact?contentType=image/fits&lossless=true", timeout=STEP).status_code == 200
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
