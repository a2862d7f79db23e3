"""Third-party test of herald's authentication (docs/security.md, docs/protocol.md "Auth").

Tokens are made with PyJWT, not with herald's own code, so both sides of the contract are
checked: what a standard JWT library signs, herald accepts, and grants are enforced as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time

import jwt
import pytest
import requests
from websockets.asyncio.client import connect as ws_connect

from test_protocol import (
    STEP,
    Herald,
    assert_alive,
    expect_close,
    publish,
    recv_json,
    recv_msg,
    run_async,
    send_json,
    subscribe,
)

SECRET = "python-test-secret-at-least-32-bytes!"
ADMIN = "python-admin-key"


@contextlib.contextmanager
def secured_herald(config: str, server=Herald, *args: str):
    """`server` (a `Herald`, or a subclass) with auth on: tokens signed with SECRET, the admin
    key ADMIN in `{dir}/admin`, and `config` as its TOML (`{dir}` is the folder holding both);
    stopped, and checked to exit cleanly, at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        secret = os.path.join(tmp, "secret")
        toml = os.path.join(tmp, "herald.toml")
        with open(secret, "w") as f:
            f.write(SECRET + "\n")
        with open(os.path.join(tmp, "admin"), "w") as f:
            f.write(ADMIN)
        with open(toml, "w") as f:
            f.write(config.replace("{dir}", tmp))
        running = server("--config", toml, "--auth-hs256-secret-file", secret, *args)
        try:
            yield running
        finally:
            running.stop_and_check()


@pytest.fixture(scope="module")
def secured():
    with secured_herald('[auth]\nadmin_api_key_file = "{dir}/admin"\naudience = "py"\nleeway_secs = 0\n') as server:
        yield server


def token(sub=(), pub=(), ttl=60, key=SECRET, alg="HS256", **claims) -> str:
    body = {"sub": "py", "aud": "py", "exp": int(time.time()) + ttl, "herald": {"sub": list(sub), "pub": list(pub)}}
    body.update(claims)
    return jwt.encode(body, key, algorithm=alg)


async def connect(server: Herald, query: str = "", bearer: str | None = None):
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else None
    return await asyncio.wait_for(ws_connect(server.ws_url + query, additional_headers=headers), STEP)


@run_async
async def test_pyjwt_tokens_grant_exactly_their_patterns(secured):
    reader = await connect(secured, f"?token={token(sub=['quotes/fx/>'])}")
    await subscribe(reader, "quotes/fx/EURUSD", id=1)
    for wider in ["quotes/>", ">", "*/>", "quotes/*/EURUSD", "orders/>"]:
        await send_json(reader, {"op": "sub", "id": 2, "topic": wider})
        reply = await recv_json(reader)
        assert (reply["op"], reply["code"], reply["id"]) == ("error", "forbidden", 2), reply
    await assert_alive(reader)

    writer = await connect(secured, bearer=token(pub=["quotes/fx/>"]))
    await publish(writer, "quotes/fx/EURUSD", "1.0842", id=1)
    assert (await recv_msg(reader))["data"] == "1.0842"
    await send_json(writer, {"op": "pub", "id": 2, "topic": "quotes/eq/X", "data": "1"})
    assert (await recv_json(writer))["code"] == "forbidden"

    late = await connect(secured)
    await send_json(late, {"op": "auth", "id": 9, "token": token(sub=["news/*"])})
    authed = await recv_json(late)
    assert authed["op"] == "authed" and authed["id"] == 9 and authed["exp"] > time.time(), authed
    await subscribe(late, "news/today")
    for ws in (reader, writer, late):
        await ws.close()


@pytest.mark.parametrize(
    "bad",
    [
        token(ttl=-10),
        token(key="a-different-secret-a-different-secret"),
        token(aud="elsewhere"),
        jwt.encode({"exp": int(time.time()) + 60, "aud": "py", "herald": {"sub": [">"]}}, None, algorithm="none"),
        token(sub=["a"])[:-3] + "AAA",
    ],
    ids=["expired", "wrong-key", "wrong-aud", "alg-none", "tampered"],
)
@run_async
async def test_bad_tokens_are_unauthorized_4003(secured, bad):
    ws = await connect(secured, f"?token={bad}")
    reply = await recv_json(ws)
    assert (reply["op"], reply["code"]) == ("error", "unauthorized"), reply
    assert await expect_close(ws) == (4003, "unauthorized")


@run_async
async def test_expiry_closes_4001(secured):
    ws = await connect(secured, bearer=token(sub=["a/>"], ttl=1))
    await subscribe(ws, "a/b")
    assert await asyncio.wait_for(expect_close(ws), 6) == (4001, "token expired")


def test_http_publish_and_metrics_need_credentials(secured):
    url = f"{secured.http}/api/publish/orders/1"
    assert requests.post(url, data=b"x", timeout=STEP).status_code == 401
    granted = {"Authorization": f"Bearer {token(pub=['orders/>'])}"}
    assert requests.post(url, data=b"x", headers=granted, timeout=STEP).status_code == 200
    other = {"Authorization": f"Bearer {token(pub=['news/>'])}"}
    r = requests.post(url, data=b"x", headers=other, timeout=STEP)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    assert requests.get(f"{secured.http}/metrics", timeout=STEP).status_code == 401
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert requests.get(f"{secured.http}/metrics", headers=admin, timeout=STEP).status_code == 200


@run_async
async def test_lossless_needs_its_own_grant(secured):
    """A lossless subscriber holds publishers: a token that may only read cannot subscribe
    losslessly; one with a `lossless` grant covering the pattern can."""
    reader = await connect(secured, f"?token={token(sub=['jobs/>'])}")
    await send_json(reader, {"op": "sub", "id": 1, "topic": "jobs/a", "policy": "lossless"})
    reply = await recv_json(reader)
    assert (reply["op"], reply["code"], reply["id"]) == ("error", "forbidden", 1), reply
    assert "lossless" in reply["message"]
    await subscribe(reader, "jobs/a", id=2, policy="drop")
    worker = await connect(secured, f"?token={jwt_with_lossless(['jobs/>'], ['jobs/a/>'])}")
    await send_json(worker, {"op": "sub", "id": 3, "topic": "jobs/>", "policy": "lossless"})
    assert (await recv_json(worker))["code"] == "forbidden"
    await subscribe(worker, "jobs/a/x", id=4, policy="lossless", window=1)
    for ws in (reader, worker):
        await ws.close()


def jwt_with_lossless(sub, lossless) -> str:
    body = {"sub": "py", "aud": "py", "exp": int(time.time()) + 60,
            "herald": {"sub": list(sub), "lossless": list(lossless)}}
    return jwt.encode(body, SECRET, algorithm="HS256")
