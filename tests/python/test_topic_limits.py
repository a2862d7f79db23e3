"""The memory topics may take (docs/security.md, "Limits"): `max_topics` refuses new topics past
the count, and `topic_idle_secs` forgets topics with no publish and no subscriber."""

from __future__ import annotations

import asyncio
import time

import requests

from test_protocol import STEP, Herald, connect, publish, recv_json, send_json, subscribe


def test_max_topics_refuses_new_topics_over_http_and_websocket():
    server = Herald("--max-topics", "3")
    try:
        for t in ("a", "b", "c"):
            assert requests.post(f"{server.http}/api/publish/{t}", data="x", timeout=STEP).status_code == 200
        r = requests.post(f"{server.http}/api/publish/d", data="x", timeout=STEP)
        assert r.status_code == 503 and r.json()["code"] == "too_many_topics", r.text
        assert requests.post(f"{server.http}/api/publish/a", data="y", timeout=STEP).status_code == 200

        async def body():
            ws = await connect(server)
            await send_json(ws, {"op": "pub", "id": 1, "topic": "e", "data": "x"})
            reply = await recv_json(ws)
            assert (reply["op"], reply["code"], reply["id"]) == ("error", "too_many_topics", 1), reply
            await publish(ws, "b", "z", id=2)
            await ws.close()

        asyncio.run(asyncio.wait_for(body(), 10))
        metrics = requests.get(f"{server.http}/metrics", timeout=STEP).text
        assert 'herald_request_errors_total{code="too_many_topics"} 2' in metrics, metrics
    finally:
        server.stop_and_check()


def test_idle_topics_without_subscribers_are_forgotten():
    server = Herald("--topic-idle-secs", "1")
    try:

        async def body():
            ws = await connect(server)
            await subscribe(ws, "held/>", id=1)
            for t in ("gone/1", "gone/2", "held/1"):
                assert requests.post(f"{server.http}/api/publish/{t}", data="x", timeout=STEP).status_code == 200
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                listed = requests.get(f"{server.http}/api/topics", timeout=STEP).json()
                if [t["topic"] for t in listed["topics"]] == ["held/1"]:
                    break
                await asyncio.sleep(0.25)
            else:
                raise AssertionError(f"idle topics were not forgotten: {listed}")
            metrics = requests.get(f"{server.http}/metrics", timeout=STEP).text
            assert "herald_topics_forgotten_total 2" in metrics, metrics
            await ws.close()

        asyncio.run(asyncio.wait_for(body(), 20))
    finally:
        server.stop_and_check()


def test_each_token_subject_has_its_own_topic_quota():
    """With auth on, the topics a token's subject created count against its own
    `max_topics_per_subject` (over WebSocket and HTTP alike); another subject is unaffected."""
    import jwt

    from test_auth import SECRET, secured_herald

    def token(subject: str) -> str:
        claims = {"sub": subject, "aud": "py", "exp": int(time.time()) + 60, "herald": {"pub": ["orders/>"]}}
        return jwt.encode(claims, SECRET, algorithm="HS256")

    with secured_herald('[auth]\naudience = "py"\n[limits]\nmax_topics_per_subject = 2\n') as server:
        alice = token("alice")
        bob = token("bob")

        async def body():
            ws = await connect(server)
            await send_json(ws, {"op": "auth", "id": 0, "token": alice})
            assert (await recv_json(ws))["op"] == "authed"
            await publish(ws, "orders/a1", "x", id=1)
            await publish(ws, "orders/a2", "x", id=2)
            await send_json(ws, {"op": "pub", "id": 3, "topic": "orders/a3", "data": "x"})
            reply = await recv_json(ws)
            assert (reply["op"], reply["code"], reply["id"]) == ("error", "too_many_topics", 3), reply
            await publish(ws, "orders/a1", "again", id=4)
            await ws.close()

        asyncio.run(asyncio.wait_for(body(), 10))
        over = requests.post(
            f"{server.http}/api/publish/orders/a4", data="x", timeout=STEP,
            headers={"Authorization": f"Bearer {alice}"},
        )
        assert over.status_code == 503 and over.json()["code"] == "too_many_topics", over.text
        fine = requests.post(
            f"{server.http}/api/publish/orders/b1", data="x", timeout=STEP,
            headers={"Authorization": f"Bearer {bob}"},
        )
        assert fine.status_code == 200, fine.text
