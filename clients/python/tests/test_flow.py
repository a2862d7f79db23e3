"""Lossless back-pressure against a real herald: the client grants credit only once the consumer
has handled a message, so herald holds the publisher while the consumer is behind, and nothing
is lost."""

from __future__ import annotations

import asyncio
import time

from conftest import Herald, run_async, within

import herald_client
from herald_client import Message


async def publish_counting(pub: herald_client.Client, topic: str, payloads: list[str], acked: list[int]) -> None:
    for p in payloads:
        await pub.publish(topic, p)
        acked[0] += 1


@run_async()
async def test_lossless_iterator_holds_the_publisher_to_the_window(herald: Herald) -> None:
    window, total, pause = 2, 20, 0.05
    acked = [0]
    async with herald_client.connect(herald.url) as h, herald_client.connect(herald.url) as pub:
        sub = await h.subscribe("f1/jobs", policy="lossless", window=window)
        started = time.monotonic()
        publishing = asyncio.ensure_future(
            publish_counting(pub, "f1/jobs", [str(i) for i in range(1, total + 1)], acked)
        )
        seqs = []
        async for m in sub:
            seqs.append(m.seq)
            await asyncio.sleep(pause)  # handling the message; herald has time to act meanwhile
            # Until message i is handled, herald has credit for the i-1 before it only, so it
            # has let at most i-1+window publishes through.
            assert acked[0] <= m.seq - 1 + window, (m.seq, acked[0])
            if m.seq == total:
                break
        await within(publishing)
        assert seqs == list(range(1, total + 1))
        assert time.monotonic() - started >= (total - window) * pause


@run_async()
async def test_a_large_snapshot_spends_no_credit_and_earns_none(herald: Herald) -> None:
    """A snapshot of more topics than herald sends with its reply comes in slices, each
    announced by a `snapshot` notice: the client counts those messages as recovered, so it
    grants no credit for them, and herald still holds the publisher to the window after."""
    topics, window, total = 3000, 2, 12
    acked = [0]
    async with herald_client.connect(herald.url) as h, herald_client.connect(herald.url) as pub:
        for i in range(topics):
            await pub.publish(f"f5/snap/{i:05}", "v", ack=False)
        await pub.publish("f5/snap/last", "v")
        sub = await h.subscribe("f5/>", policy="lossless", window=window, snapshot=True)
        values = 0
        async for m in sub:
            if m.topic.startswith("f5/snap/"):
                values += 1
                if values == topics + 1:
                    break
        publishing = asyncio.ensure_future(
            publish_counting(pub, "f5/jobs", [str(i) for i in range(1, total + 1)], acked)
        )
        async for m in sub:
            await asyncio.sleep(0.05)
            # Had the snapshot's later slices been taken for live messages, the client would
            # have granted herald thousands of credits, and the publisher would run ahead.
            assert acked[0] <= m.seq - 1 + window, (m.seq, acked[0])
            if m.seq == total:
                break
        await within(publishing)


@run_async()
async def test_lossless_handler_grants_credit_after_it_returns(herald: Herald) -> None:
    window, total = 3, 15
    acked = [0]
    seen: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def handler(m: Message) -> None:
        await asyncio.sleep(0.03)
        seen.append((m.seq, acked[0]))  # at the end of handling: no credit for m yet
        if m.seq == total:
            done.set()

    async with herald_client.connect(herald.url) as h, herald_client.connect(herald.url) as pub:
        await h.subscribe("f2/jobs", handler, policy="lossless", window=window)
        await within(publish_counting(pub, "f2/jobs", [str(i) for i in range(total)], acked), 10)
        await within(done.wait())
        assert [s for s, _ in seen] == list(range(1, total + 1))
        assert all(a <= s - 1 + window for s, a in seen), seen


@run_async()
async def test_lossless_byte_window_grants_back_payload_sizes(herald: Herald) -> None:
    size, window_bytes, total = 1000, 3000, 12
    acked = [0]
    async with herald_client.connect(herald.url) as h, herald_client.connect(herald.url) as pub:
        sub = await h.subscribe("f3/jobs", policy="lossless", window_bytes=window_bytes)
        publishing = asyncio.ensure_future(publish_counting(pub, "f3/jobs", ["é" * (size // 2)] * total, acked))
        async for m in sub:
            assert m.size == size  # UTF-8 bytes of the text, as herald counts them
            await asyncio.sleep(0.03)
            assert acked[0] <= m.seq - 1 + window_bytes // size, (m.seq, acked[0])
            if m.seq == total:
                break
        await within(publishing)


@run_async()
async def test_a_consumer_that_never_grants_is_cut_by_herald_and_the_publisher_goes_on() -> None:
    server = Herald(config="lossless_hold_timeout_ms = 500\n")
    try:
        async with (
            herald_client.connect(server.url, min_delay=0.05) as h,
            herald_client.connect(server.url) as pub,
        ):
            states: list[str] = []
            h.on("state", lambda e: states.append(f"{e.state} {e.code}"))
            sub = await h.subscribe("f4/jobs", policy="lossless", window=1)
            await pub.publish("f4/jobs", "1")
            first = await within(sub.__anext__())  # taken, never handled: no credit goes back
            assert first.seq == 1
            started = time.monotonic()
            await within(pub.publish("f4/jobs", "2"))
            await within(pub.publish("f4/jobs", "3"))  # held until herald cuts the consumer
            assert time.monotonic() - started >= 0.4
            while "reconnecting 4008" not in states:
                await asyncio.sleep(0.01)
    finally:
        server.close()
