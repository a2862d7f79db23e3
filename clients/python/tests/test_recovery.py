"""Reconnect and recovery against a real herald: a socket that dies (recovered from history), a
topic first published while the client was away (the subscription cursor), a server restart
(epoch changed, reported as a gap), and `dropped` notices from a slow-consumer policy."""

from __future__ import annotations

import asyncio
import collections.abc

import pytest
from conftest import Herald, Proxy, run_async, within

import herald_client
from herald_client import Dropped, Message, Resubscribed, StateEvent


async def wait_for_state(states: list[StateEvent], state: str, after: int = 0) -> None:
    while not any(s.state == state for s in states[after:]):
        await asyncio.sleep(0.01)


async def take(sub: herald_client.Subscription, n: int) -> list[Message]:
    return [await within(sub.__anext__()) for _ in range(n)]


async def away(
    proxy: Proxy, states: list[StateEvent], while_away: collections.abc.Callable[[], collections.abc.Awaitable[None]]
) -> None:
    """Cuts the client's connection, runs `while_away` while it cannot reconnect, lets it back."""
    mark = len(states)
    proxy.refuse = True
    proxy.cut()
    await within(wait_for_state(states, "reconnecting", mark))
    await while_away()
    proxy.refuse = False
    await within(wait_for_state(states, "open", mark))


@run_async()
async def test_a_dropped_socket_is_recovered_without_loss_or_duplicates(herald: Herald) -> None:
    proxy = Proxy(herald.port)
    await proxy.start()
    states: list[StateEvent] = []
    resubscribed: list[Resubscribed] = []
    try:
        async with (
            herald_client.connect(proxy.url, min_delay=0.05, max_delay=0.2) as h,
            herald_client.connect(herald.url) as pub,
        ):
            h.on("state", states.append)
            h.on("resubscribed", resubscribed.append)
            sub = await h.subscribe("r1/>")
            await pub.publish("r1/a", "1")
            assert [m.data for m in await take(sub, 1)] == ["1"]

            async def publish_two() -> None:
                await pub.publish("r1/a", "2")
                await pub.publish("r1/a", "3")

            await away(proxy, states, publish_two)
            await pub.publish("r1/a", "4")
            got = await take(sub, 3)
            assert [(m.seq, m.data) for m in got] == [(2, "2"), (3, "3"), (4, "4")]
            assert [(r.pattern, r.recovered, r.replayed, r.gaps) for r in resubscribed] == [("r1/>", True, 2, ())]
            assert [s.state for s in states if s.state in ("reconnecting", "open")][:2] == ["reconnecting", "open"]
    finally:
        await proxy.close()


@run_async()
async def test_wildcard_recovery_replays_topics_first_published_while_away(herald: Herald) -> None:
    """The subscription cursor: topics the client never saw (new, or quiet until it left) are
    replayed after a reconnect, and herald's `recovered` is reported as it is."""
    proxy = Proxy(herald.port)
    await proxy.start()
    states: list[StateEvent] = []
    resubscribed: list[Resubscribed] = []
    try:
        async with (
            herald_client.connect(proxy.url, min_delay=0.05, max_delay=0.2) as h,
            herald_client.connect(herald.url) as pub,
        ):
            await pub.publish("r2/quiet", "q1")  # before the subscription: not seen by it
            h.on("state", states.append)
            h.on("resubscribed", resubscribed.append)
            sub = await h.subscribe("r2/>")
            assert sub.subscribed is not None and sub.subscribed.cursor, "herald sent no cursor"
            await pub.publish("r2/seen", "s1")
            assert [m.data for m in await take(sub, 1)] == ["s1"]

            async def publish_while_away() -> None:
                await pub.publish("r2/new", "n1")
                await pub.publish("r2/quiet", "q2")
                await pub.publish("r2/seen", "s2")

            await away(proxy, states, publish_while_away)
            got = await take(sub, 3)
            assert sorted((m.topic, m.data) for m in got) == [("r2/new", "n1"), ("r2/quiet", "q2"), ("r2/seen", "s2")]
            assert [(r.recovered, r.replayed, r.gaps) for r in resubscribed] == [(True, 3, ())]
            await pub.publish("r2/new", "n2")
            assert [(m.topic, m.seq) for m in await take(sub, 1)] == [("r2/new", 2)]
    finally:
        await proxy.close()


@run_async()
async def test_wildcard_recovery_reports_what_history_no_longer_holds() -> None:
    server = Herald(config='[[history]]\npattern = ">"\nmax_messages = 2\n')
    proxy = Proxy(server.port)
    await proxy.start()
    states: list[StateEvent] = []
    try:
        async with (
            herald_client.connect(proxy.url, min_delay=0.05, max_delay=0.2) as h,
            herald_client.connect(server.url) as pub,
        ):
            h.on("state", states.append)
            sub = await h.subscribe("r3/>")

            async def publish_five() -> None:
                for i in range(1, 6):
                    await pub.publish("r3/new", str(i))

            await away(proxy, states, publish_five)
            with pytest.raises(herald_client.GapError) as gap:
                await within(sub.__anext__())
            assert [(g.topic, g.reason, g.first, g.last) for g in gap.value.gaps] == [
                ("r3/new", "history_trimmed", 1, 3)
            ]
            assert [m.data for m in await take(sub, 2)] == ["4", "5"]
    finally:
        await proxy.close()
        server.close()


@run_async()
async def test_a_server_restart_reports_the_epoch_change(fresh_herald: Herald) -> None:
    resubscribed: list[Resubscribed] = []
    states: list[StateEvent] = []
    async with herald_client.connect(fresh_herald.url, min_delay=1.0, max_delay=1.0) as h:
        h.on("resubscribed", resubscribed.append)
        h.on("state", states.append)
        sub = await h.subscribe("r4/>")
        async with herald_client.connect(fresh_herald.url) as pub:
            await pub.publish("r4/a", "old")
        old = (await take(sub, 1))[0]
        fresh_herald.restart()  # the same port; history lost, so a new epoch
        # Published before the subscriber's backoff (0.5-1 s) lets it come back.
        async with herald_client.connect(fresh_herald.url) as pub:
            await pub.publish("r4/a", "new")
        await within(wait_for_state(states, "open"))
        with pytest.raises(herald_client.GapError) as gap:
            await within(sub.__anext__())
        assert len(gap.value.gaps) == 1
        g = gap.value.gaps[0]
        assert (g.topic, g.reason) == ("r4/a", "epoch_changed") and g.epoch != old.epoch
        m = (await take(sub, 1))[0]
        assert (m.data, m.seq) == ("new", 1) and m.epoch != old.epoch
        assert len(resubscribed) == 1 and resubscribed[0].recovered is False
        assert [g.reason for g in resubscribed[0].gaps] == ["epoch_changed"]


@run_async()
async def test_herald_closing_for_good_ends_iterators_with_the_reason(fresh_herald: Herald) -> None:
    h = await herald_client.connect(fresh_herald.url, reconnect=False)
    sub = await h.subscribe("r5/x")
    fresh_herald.stop()
    with pytest.raises(herald_client.ConnectionLost) as e:
        await within(sub.__anext__())
    assert e.value.close_code == 1001
    assert e.value.close_reason.startswith("server shutting down")
    assert h.state == "closed"
    await h.close()


@run_async(40)
async def test_dropped_notices_are_surfaced_with_exact_counts() -> None:
    server = Herald("--max-outbound-bytes", "65536")
    dropped: list[Dropped] = []
    try:
        async with herald_client.connect(server.url) as h, herald_client.connect(server.url) as pub:
            h.on("dropped", dropped.append)
            # A buffer of one: the client stops reading while nobody iterates, so herald's
            # queue for it fills and the `drop` policy acts.
            sub = await h.subscribe("r6/x", policy="drop", buffer=1)
            total = 600
            chunk = bytes(32 * 1024)
            for _ in range(total):
                await pub.publish("r6/x", chunk, ack=False)
            await pub.ping()
            received: list[Message] = []
            while not received or received[-1].seq < total:
                received.append(await within(sub.__anext__()))
            skipped = sum(m.dropped for m in received)
            assert skipped > 0, "herald dropped nothing: the test did not make a slow consumer"
            assert skipped + len(received) == total
            prev = 0
            for m in received:
                assert m.seq == prev + 1 + m.dropped
                prev = m.seq
            assert sum(d.count for d in dropped) == skipped
            assert {(d.topic, d.reason) for d in dropped} == {("r6/x", "drop")}
    finally:
        server.close()


@run_async()
async def test_a_failing_token_callback_is_reported_and_retried(herald: Herald) -> None:
    proxy = Proxy(herald.port)
    await proxy.start()
    calls = 0

    def token() -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("the identity provider is down")
        return "any-token"  # herald without authentication accepts any

    errors: list[herald_client.HeraldError] = []
    states: list[StateEvent] = []
    try:
        async with herald_client.connect(proxy.url, token=token, min_delay=0.05, max_delay=0.1) as h:
            h.on("error", errors.append)
            h.on("state", states.append)
            proxy.cut()
            await within(wait_for_state(states, "open"))
            await h.ping()
        assert calls == 3
        assert [e.code for e in errors] == ["token"]
        assert "the identity provider is down" in errors[0].message
    finally:
        await proxy.close()
