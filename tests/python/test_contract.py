"""The delivery contract under the conditions that broke it: recoveries (snapshot, `since`)
larger than a connection's outbound bound, and requests whose fields have the wrong type.

Written from docs/semantics.md and docs/protocol.md only, over real loopback sockets.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import requests
from test_protocol import (
    HERALD_BIN,
    STEP,
    Herald,
    connect,
    herald,  # noqa: F401  (the shared server fixture)
    recv_frame,
    recv_json,
    run_async,
    send_json,
    subscribe,
)

MIB = 1 << 20


def http_publish(server: Herald, topic: str, body: bytes) -> int:
    r = requests.post(
        f"{server.http}/api/publish/{topic}",
        data=body,
        headers={"Content-Type": "application/octet-stream"},
        timeout=STEP,
    )
    assert r.status_code == 200, r.text
    return r.json()["seq"]


def binary_message(frame: bytes) -> tuple[dict, bytes]:
    assert isinstance(frame, bytes), f"expected a binary message, got {frame[:80]!r}"
    n = int.from_bytes(frame[:4], "big")
    return json.loads(frame[4 : 4 + n]), frame[4 + n :]


def image(i: int, size: int) -> bytes:
    return bytes([i % 251]) * size


def test_a_snapshot_larger_than_the_outbound_bound_arrives_whole():
    """20 last values of 1 MiB (more than the default 16 MiB bound on live messages): the reply
    comes first, then every value whole, and the connection stays open; `herald sub
    --snapshot` (the README's command) receives them too."""
    server = Herald()
    try:
        for i in range(20):
            http_publish(server, f"camera/{i}/raw", image(i, MIB))

        async def body():
            ws = await connect(server)
            reply = await subscribe(ws, "camera/>", id=1, snapshot=True)
            assert reply["recovered"] is True and reply["replayed"] == 20, reply
            seen = set()
            for _ in range(20):
                head, payload = binary_message(await recv_frame(ws))
                i = int(head["topic"].split("/")[1])
                assert payload == image(i, MIB), head
                seen.add(i)
            assert seen == set(range(20))
            await send_json(ws, {"op": "ping", "id": 2})
            assert (await recv_json(ws)) == {"op": "pong", "id": 2}
            await ws.close()

        asyncio.run(asyncio.wait_for(body(), 30))
        out = subprocess.run(
            [HERALD_BIN, "sub", "camera/>", "--snapshot", "--count", "20", "--json",
             "--url", server.ws_url],
            capture_output=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr.decode()
        assert len(out.stdout.decode().strip().splitlines()) == 20
    finally:
        server.stop_and_check()


def test_since_beyond_the_outbound_bound_replays_and_reports_what_history_lost():
    """With a 256 KiB outbound bound, a `since` whose replay is ~1 MiB is sent whole, on every
    retry, and the reply says exactly what history no longer holds."""
    server = Herald("--max-outbound-bytes", "262144")
    try:
        seqs = [http_publish(server, "big/t", image(n, 64 << 10)) for n in range(20)]
        assert seqs == list(range(1, 21))

        async def body():
            epoch = None
            probe = await connect(server)
            await subscribe(probe, "big/t", id=0, snapshot=True)
            head, _ = binary_message(await recv_frame(probe))
            epoch = head["epoch"]
            await probe.close()
            for since in (4, 10, 16):
                ws = await connect(server)
                reply = await subscribe(
                    ws, "big/t", id=since, since={"big/t": {"seq": since, "epoch": epoch}}
                )
                got = []
                for _ in range(reply["replayed"]):
                    head, payload = binary_message(await recv_frame(ws))
                    assert payload == image(head["seq"] - 1, 64 << 10)
                    got.append(head["seq"])
                assert got and got[-1] == 20 and got == list(range(got[0], 21)), got
                if got[0] > since + 1:
                    assert reply["recovered"] is False
                    assert reply["gaps"] == [
                        {"topic": "big/t", "reason": "history_trimmed", "from": since + 1, "to": got[0] - 1}
                    ], reply
                else:
                    assert reply["recovered"] is True, reply
                await send_json(ws, {"op": "ping", "id": "alive"})
                assert (await recv_json(ws))["op"] == "pong"
                await ws.close()

        asyncio.run(asyncio.wait_for(body(), 30))
    finally:
        server.stop_and_check()


def test_a_recovery_over_its_own_limit_sends_the_newest_and_names_the_rest():
    """`max_recovery_bytes` bounds a recovery: the newest messages are sent, the oldest are a
    `recovery_limit` gap, and the connection is not cut."""
    server = Herald("--max-recovery-bytes", str(5 * (64 << 10) + 1000))
    try:
        for n in range(10):
            http_publish(server, "lim/t", image(n, 64 << 10))

        async def body():
            ws = await connect(server)
            reply = await subscribe(ws, "lim/>", id=1, cursor="from-elsewhere")
            assert reply["recovered"] is False
            assert reply["replayed"] == 5
            assert reply["gaps"] == [{"topic": "lim/t", "reason": "recovery_limit", "from": 1, "to": 5}]
            got = [binary_message(await recv_frame(ws))[0]["seq"] for _ in range(5)]
            assert got == [6, 7, 8, 9, 10]
            await send_json(ws, {"op": "ping", "id": 1})
            assert (await recv_json(ws))["op"] == "pong"
            await ws.close()

        asyncio.run(asyncio.wait_for(body(), 20))
    finally:
        server.stop_and_check()


@run_async
async def test_a_field_of_the_wrong_type_is_an_error_with_the_request_id(herald):
    ws = await connect(herald)
    cases = [
        ({"op": "sub", "id": 1, "topic": 5}, "topic"),
        ({"op": "pub", "id": 2, "topic": "a", "data": {"x": 1}}, "data"),
        ({"op": "sub", "id": 3, "topic": "a", "snapshot": "yes"}, "snapshot"),
        ({"op": "sub", "id": 4, "topic": "a", "window": "ten"}, "window"),
        ({"op": "sub", "id": "five", "topic": "a", "policy": "fastest"}, "policy"),
    ]
    for request, field in cases:
        await send_json(ws, request)
        reply = await recv_json(ws)
        assert reply["op"] == "error" and reply["code"] == "bad_json", reply
        assert reply["id"] == request["id"], reply
        assert f"`{field}`" in reply["message"], reply
    await ws.close()
