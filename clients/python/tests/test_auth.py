"""Authentication against a real herald with an HS256 secret, tokens minted by `herald token`
(docs/security.md): the three ways to present a token, grants, refusals, and refresh."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from typing import Literal

import pytest
from conftest import Herald, run_async, within

import herald_client


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[Herald, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        secret = os.path.join(tmp, "secret")
        with open(secret, "w") as f:
            f.write("python-client-test-secret-of-at-least-32-bytes\n")
        server = Herald("--auth-hs256-secret-file", secret, config="[auth]\nleeway_secs = 0\n")
        yield server, secret
        server.close()


@run_async()
async def test_tokens_in_header_query_and_message_grant_exactly_their_patterns(secured: tuple[Herald, str]) -> None:
    server, secret = secured
    reader = server.token(secret, "--sub", "quotes/fx/>", "--ttl", "600")
    writer = server.token(secret, "--pub", "quotes/fx/>", "--ttl", "600")
    async with (
        herald_client.connect(server.url, token=reader) as r,
        herald_client.connect(server.url, token=writer, token_in="query") as w,
        herald_client.connect(server.url, token=reader, token_in="message") as r2,
    ):
        sub = await r.subscribe("quotes/fx/*")
        sub2 = await r2.subscribe("quotes/fx/EURUSD")
        with pytest.raises(herald_client.Forbidden) as refused:
            await r.subscribe("quotes/>")
        assert refused.value.code == "forbidden"
        await w.publish("quotes/fx/EURUSD", "1.0842")
        assert (await within(sub.__anext__())).data == "1.0842"
        assert (await within(sub2.__anext__())).data == "1.0842"
        with pytest.raises(herald_client.Forbidden):
            await w.publish("quotes/eq/ACME", "1")
        with pytest.raises(herald_client.Forbidden):
            await r.publish("quotes/fx/EURUSD", "1.09")
        await r.ping()  # a refused request leaves the connection open


@run_async()
async def test_missing_or_bad_tokens_are_refused_at_connect(secured: tuple[Herald, str]) -> None:
    server, secret = secured
    with pytest.raises(herald_client.Unauthorized) as none:
        await herald_client.connect(server.url)
    assert none.value.code == "unauthorized"
    modes: tuple[Literal["header", "query", "message"], ...] = ("header", "query", "message")
    for token_in in modes:
        with pytest.raises(herald_client.Unauthorized):
            await herald_client.connect(server.url, token="not.a.token", token_in=token_in)
    expired = server.token(secret, "--sub", "quotes/>", "--ttl", "1")
    await asyncio.sleep(2.1)
    with pytest.raises(herald_client.Unauthorized):
        await herald_client.connect(server.url, token=expired)


@run_async()
async def test_a_token_callback_refreshes_before_expiry(secured: tuple[Herald, str]) -> None:
    server, secret = secured
    minted: list[str] = []

    def fresh() -> str:
        minted.append(server.token(secret, "--sub", "refresh/>", "--pub", "refresh/>", "--ttl", "3"))
        return minted[-1]

    errors: list[herald_client.HeraldError] = []
    states: list[str] = []
    async with herald_client.connect(server.url, token=fresh, token_in="message") as h:
        h.on("error", errors.append)
        h.on("state", lambda e: states.append(e.state))
        sub = await h.subscribe("refresh/x")
        await asyncio.sleep(5)  # past the first token's expiry: only refreshes keep it open
        await h.publish("refresh/x", "still here")
        assert (await within(sub.__anext__())).data == "still here"
    assert len(minted) >= 3, minted
    assert errors == [] and "reconnecting" not in states
