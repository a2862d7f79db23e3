"""Third-party test of how herald closes a client for a limit (docs/security.md, "Limits").

A client that is still writing when herald closes it must still receive herald's error and its
close code: herald sends them, then reads on (discarding) until the client's close frame or a
bounded grace, instead of dropping the TCP connection, whose reset would discard them at the
client (RFC 6455 7.1.1).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from test_protocol import STEP, Herald, run_async


@pytest.fixture(scope="module")
def limited():
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "herald.toml")
        with open(config, "w") as f:
            f.write("[limits]\nmax_messages_per_sec = 20\n")
        server = Herald("--config", config)
        yield server
        server.stop_and_check()


@pytest.mark.parametrize("attempt", range(3))
@run_async
async def test_a_client_writing_flat_out_gets_rate_limited_and_1008(limited, attempt):
    ws = await asyncio.wait_for(ws_connect(limited.ws_url), STEP)
    errors = []

    async def read():
        try:
            async for message in ws:
                reply = json.loads(message)
                if reply.get("op") == "error":
                    errors.append(reply["code"])
        except ConnectionClosed:
            pass

    reader = asyncio.create_task(read())
    frame = json.dumps({"op": "pub", "topic": "t", "data": "x"})
    try:
        for _ in range(20000):
            await ws.send(frame)
    except ConnectionClosed:
        pass
    await asyncio.wait_for(reader, STEP)
    assert errors == ["rate_limited"], errors
    assert ws.close_code == 1008, ws.close_code
