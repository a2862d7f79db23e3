"""The client against a real herald: publishing and receiving text, JSON and binary payloads,
wildcards, snapshots, `since`, and the typed errors for bad input."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import urllib.request

import numpy as np
import pytest
from conftest import Herald, run_async, within

import herald_client
from herald_client import Message, Position


@run_async()
async def test_text_publish_and_delivery(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        sub = await h.subscribe("t1/quotes/*")
        assert sub.subscribed is not None and sub.subscribed.pattern == "t1/quotes/*"
        ack = await h.publish("t1/quotes/EURUSD", "1.0842", ct="text/plain", stamp=True)
        assert ack == herald_client.Ack("t1/quotes/EURUSD", 1)
        before = time.time() * 1e6
        assert await h.publish("t1/quotes/EURUSD", "1.0843", ack=False) is None
        await h.publish("t1/quotes/GBPUSD", {"bid": 1.25})

        m: Message = await within(sub.__anext__())
        assert (m.topic, m.seq, m.data, m.ct, m.binary) == ("t1/quotes/EURUSD", 1, "1.0842", "text/plain", False)
        assert m.ts is not None and abs(m.ts - before) < 5e6
        assert isinstance(m.epoch, str) and m.epoch
        m2 = await within(sub.__anext__())
        assert (m2.seq, m2.data, m2.ct, m2.ts, m2.epoch) == (2, "1.0843", None, None, m.epoch)
        m3 = await within(sub.__anext__())
        assert (m3.topic, m3.json(), m3.ct) == ("t1/quotes/GBPUSD", {"bid": 1.25}, "application/json")


@run_async()
async def test_binary_payloads_of_every_kind_arrive_byte_for_byte(herald: Herald) -> None:
    every_byte = bytes(range(256))
    image = np.arange(64 * 48, dtype=">u2").reshape(64, 48)
    big = os.urandom(200_000)  # over the size joined to its header: sent as a second fragment
    payloads: list[tuple[object, bytes]] = [
        (every_byte, every_byte),
        (bytearray(every_byte * 3), every_byte * 3),
        (memoryview(every_byte)[10:200], every_byte[10:200]),
        (image, image.tobytes()),
        (image[:, ::2], image[:, ::2].tobytes()),  # strided: sent as a copy in C order
        (b"", b""),
        (big, big),
    ]
    async with herald_client.connect(herald.url) as h:
        sub = await h.subscribe("t2/bin")
        for data, _ in payloads:
            await h.publish("t2/bin", data, ct="application/octet-stream")
        for _, want in payloads:
            m = await within(sub.__anext__())
            assert m.binary and m.ct == "application/octet-stream"
            assert isinstance(m.data, bytes) and m.data == want
            assert bytes(m.payload) == want and m.size == len(want)
        # A numpy subscriber reads the payload without a copy.
        await h.publish("t2/bin", image)
        m = await within(sub.__anext__())
        assert np.array_equal(np.frombuffer(m.payload, dtype=">u2").reshape(64, 48), image)


@run_async(60)
async def test_32_mib_binary_round_trip(herald: Herald) -> None:
    payload = np.random.default_rng(7).integers(0, 256, 32 * 1024 * 1024, dtype=np.uint8)
    async with herald_client.connect(herald.url) as sub_client, herald_client.connect(herald.url) as pub:
        sub = await sub_client.subscribe("t3/big")
        ack = await within(pub.publish("t3/big", payload, ct="image/fits"), 30)
        assert ack is not None and ack.seq == 1
        m = await within(sub.__anext__(), 30)
        assert m.size == len(payload) == 32 * 1024 * 1024
        assert hashlib.sha256(m.payload).digest() == hashlib.sha256(payload.data).digest()


@run_async()
async def test_overlapping_patterns_each_get_the_message_once(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        star = await h.subscribe("t4/*/x")
        deep = await h.subscribe("t4/>")
        other = await h.subscribe("t4/b/y")
        seen_by_handler: list[str] = []
        handled = asyncio.Event()

        def handler(m: Message) -> None:
            seen_by_handler.append(m.topic)
            if len(seen_by_handler) == 2:
                handled.set()

        await h.subscribe("t4/>", handler)  # a second subscription on the same pattern
        await h.publish("t4/a/x", "1")
        await h.publish("t4/a/b/c", "2")
        assert [(await within(star.__anext__())).topic] == ["t4/a/x"]
        assert [(await within(deep.__anext__())).topic for _ in range(2)] == ["t4/a/x", "t4/a/b/c"]
        await within(handled.wait())
        assert seen_by_handler == ["t4/a/x", "t4/a/b/c"]
        await h.publish("t4/b/y", "3")
        assert (await within(other.__anext__())).data == "3"
        assert (await within(deep.__anext__())).data == "3"
        # Nothing else was queued for `star`: the next thing it sees is this.
        await h.publish("t4/c/x", "4")
        assert (await within(star.__anext__())).topic == "t4/c/x"


@run_async()
async def test_snapshot_and_since(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        for i in range(1, 6):
            await h.publish("t5/a", f"a{i}")
        await h.publish("t5/b", "b1")
        snap = await h.subscribe("t5/*", snapshot=True)
        got = sorted([(await within(snap.__anext__())).data for _ in range(2)])
        assert got == ["a5", "b1"]

        epoch = snap.positions["t5/a"].epoch
        since = await h.subscribe("t5/a", since={"t5/a": Position(2, epoch)})
        assert since.subscribed is not None
        assert (since.subscribed.recovered, since.subscribed.replayed) == (True, 3)
        assert [(await within(since.__anext__())).data for _ in range(3)] == ["a3", "a4", "a5"]
        assert since.positions["t5/a"] == Position(5, epoch)
        # The replay also matched `snap`, which had seen a5 already: it drops a3..a5.
        await h.publish("t5/a", "a6")
        assert (await within(snap.__anext__())).data == "a6"


@run_async()
async def test_since_with_an_unknown_epoch_raises_a_gap_in_the_stream(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        await h.publish("t6/a", "1")
        await h.publish("t6/a", "2")
        sub = await h.subscribe("t6/a", since={"t6/a": (1, "not-the-epoch")})
        assert sub.subscribed is not None and sub.subscribed.recovered is False
        with pytest.raises(herald_client.GapError) as gap:
            await within(sub.__anext__())
        assert gap.value.code == "gap"
        assert [(g.topic, g.reason) for g in gap.value.gaps] == [("t6/a", "epoch_changed")]
        # The iterator goes on with what herald replayed of the new epoch.
        assert [(await within(sub.__anext__())).data for _ in range(2)] == ["1", "2"]


@run_async()
async def test_bad_input_raises_typed_errors_and_the_connection_survives(herald: Herald) -> None:
    async with herald_client.connect(herald.url) as h:
        with pytest.raises(herald_client.PublishToPattern) as e1:
            await h.publish("t7/*/x", "1")
        assert e1.value.code == "publish_to_pattern"
        with pytest.raises(herald_client.InvalidTopic) as e2:
            await h.publish("t7//x", "1")
        assert e2.value.code == "invalid_topic" and "empty level" in e2.value.message
        with pytest.raises(herald_client.InvalidTopic):
            await h.subscribe("t7/>/x")
        with pytest.raises(herald_client.NotSubscribed):
            await h._request({"op": "unsub", "topic": "t7/never"})
        with pytest.raises(TypeError):
            await h.publish("t7/x", object())
        with pytest.raises(TypeError):
            await h.publish(b"t7/x", "1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="policy"):
            await h.subscribe("t7/x", policy="sometimes")  # type: ignore[arg-type]
        await h.ping()
        assert (await h.publish("t7/x", "still fine")) is not None


@run_async()
async def test_message_too_large_is_a_typed_error() -> None:
    server = Herald("--max-message-bytes", "1000")
    try:
        async with herald_client.connect(server.url) as h:
            with pytest.raises(herald_client.MessageTooLarge) as e:
                await h.publish("t8/x", "y" * 1001)
            assert e.value.code == "message_too_large"
            await h.ping()
    finally:
        server.close()


@run_async()
async def test_connect_failures_raise() -> None:
    with pytest.raises(herald_client.NotConnected):
        await herald_client.connect("ws://127.0.0.1:1/ws", request_timeout=2)
    with pytest.raises(herald_client.HeraldError) as e:
        await herald_client.connect("http://127.0.0.1:1/ws")
    assert e.value.code == "bad_url"


@run_async()
async def test_a_closed_client_refuses_requests_and_ends_iterators(herald: Herald) -> None:
    h = await herald_client.connect(herald.url)
    sub = await h.subscribe("t9/x")
    ended = asyncio.ensure_future(sub.__anext__())
    await asyncio.sleep(0.05)
    await h.close()
    with pytest.raises(StopAsyncIteration):
        await within(ended)
    with pytest.raises(herald_client.ClientClosed):
        await h.publish("t9/x", "1")
    assert h.state == "closed"


@run_async()
async def test_conflate_with_max_rate_delivers_the_newest_and_counts_the_rest(herald: Herald) -> None:
    dropped: list[herald_client.Dropped] = []
    async with herald_client.connect(herald.url) as h, herald_client.connect(herald.url) as pub:
        h.on("dropped", dropped.append)
        sub = await h.subscribe("t10/x", policy="conflate", max_rate=5)
        for i in range(1, 51):
            await pub.publish("t10/x", str(i), ack=False)
        await pub.ping()
        got: list[Message] = []
        while not got or got[-1].data != "50":
            got.append(await within(sub.__anext__()))
        assert len(got) < 50
        prev = 0
        for m in got:
            assert m.seq == prev + 1 + m.dropped
            prev = m.seq
        assert sum(d.count for d in dropped) == sum(m.dropped for m in got) == 50 - len(got)
        assert {d.reason for d in dropped} == {"conflate"}


@run_async()
async def test_a_raising_handler_is_reported_and_delivery_goes_on(herald: Herald) -> None:
    errors: list[herald_client.HeraldError] = []
    seen: list[str] = []
    done = asyncio.Event()

    async def handler(m: Message) -> None:
        if m.data == "boom":
            raise RuntimeError("boom")
        seen.append(str(m.data))
        done.set()

    async with herald_client.connect(herald.url) as h:
        h.on("error", errors.append)
        await h.subscribe("t11/x", handler)
        await h.publish("t11/x", "boom")
        await h.publish("t11/x", "ok")
        await within(done.wait())
        assert seen == ["ok"]
        assert [e.code for e in errors] == ["handler"]
        assert "RuntimeError('boom')" in errors[0].message


def subscriptions(server: Herald) -> int:
    with urllib.request.urlopen(f"{server.http}/api/stats", timeout=5) as r:
        count: int = json.load(r)["subscriptions"]
        return count


@run_async()
async def test_unsubscribe_tells_herald_when_the_last_subscription_on_a_pattern_goes(fresh_herald: Herald) -> None:
    async with herald_client.connect(fresh_herald.url) as h:
        first = await h.subscribe("t12/>")
        second = await h.subscribe("t12/>")
        assert subscriptions(fresh_herald) == 1  # herald holds the pattern once
        await first.unsubscribe()
        assert subscriptions(fresh_herald) == 1
        await h.publish("t12/a", "still delivered")
        assert (await within(second.__anext__())).data == "still delivered"
        await second.unsubscribe()
        assert subscriptions(fresh_herald) == 0
        with pytest.raises(StopAsyncIteration):
            await within(second.__anext__())
