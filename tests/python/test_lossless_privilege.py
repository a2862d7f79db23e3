"""Back-pressure on a publisher is a privilege (docs/semantics.md, "lossless"): where it is
allowed (`lossless_topics`), and how long one subscriber may keep publishers waiting
(`lossless_max_hold_share` of each 10 s)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from test_protocol import (
    Herald,
    connect,
    expect_close,
    publish,
    recv_json,
    send_json,
    subscribe,
)


def server_with(config_text: str) -> tuple[Herald, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_text)
    return Herald("--config", f.name), f.name


def test_lossless_topics_limits_where_subscribers_may_hold_publishers():
    server, config = server_with('lossless_topics = ["jobs/>"]\n')
    try:

        async def body():
            ws = await connect(server)
            await send_json(ws, {"op": "sub", "id": 1, "topic": "quotes/x", "policy": "lossless"})
            reply = await recv_json(ws)
            assert (reply["op"], reply["code"], reply["id"]) == ("error", "forbidden", 1), reply
            assert "lossless_topics" in reply["message"]
            await send_json(ws, {"op": "sub", "id": 2, "topic": ">", "policy": "lossless"})
            assert (await recv_json(ws))["code"] == "forbidden"
            await subscribe(ws, "jobs/a", id=3, policy="lossless")
            await subscribe(ws, "quotes/x", id=4, policy="conflate")
            await ws.close()

        asyncio.run(asyncio.wait_for(body(), 20))
    finally:
        server.stop_and_check()
        os.unlink(config)


def test_a_subscriber_that_keeps_a_publisher_crawling_is_cut():
    """A subscriber granting one credit just before each hold times out would slow its topic's
    publisher to one message per timeout for ever: past half of 10 s of holding it is closed
    with 4008, and the publisher runs free again."""
    server, config = server_with("lossless_hold_timeout_ms = 2000\n")
    try:

        async def body():
            slow = await connect(server)
            await subscribe(slow, "crawl/t", id=1, policy="lossless", window=1)
            pub = await connect(server)

            async def trickle():
                while True:
                    await asyncio.sleep(1.5)
                    await send_json(slow, {"op": "credit", "topic": "crawl/t", "n": 1})

            feeder = asyncio.create_task(trickle())
            started = time.monotonic()
            held = []
            try:
                for i in range(12):
                    t = time.monotonic()
                    await publish(pub, "crawl/t", str(i), id=i + 1)
                    held.append(time.monotonic() - t)
                    if time.monotonic() - started > 14:
                        break
            finally:
                feeder.cancel()
            # Held about 1.5 s a publish until the share (5 s of 10) ran out, then not at all.
            assert any(h > 1.0 for h in held), held
            assert held[-1] < 0.5 and held[-2] < 0.5, held
            code, reason = await expect_close(slow)
            assert code == 4008 and "kept publishers waiting" in reason, (code, reason)
            await pub.close()

        asyncio.run(asyncio.wait_for(body(), 40))
    finally:
        server.stop_and_check()
        os.unlink(config)
