"""Third-party test of herald's STOMP (docs/stomp.md) with the `stomp.py` client library.

stomp.py speaks to herald over its plain TCP listener (`--stomp-listen`) and over WebSocket
at `/stomp`; herald's own protocol (the `websockets` client) and `POST /api/publish` are the
other side of the cross-protocol tests. Bad input is sent on raw sockets, since a client
library will not send it. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time

import pytest
import requests
import stomp
from stomp.adapter.ws import WSStompConnection
from test_auth import secured_herald, token
from test_protocol import (
    STEP,
    Herald,
    connect,
    decode_binary,
    encode_binary,
    free_port,
    recv_frame,
    recv_json,
    run_async,
    send_json,
    subscribe,
)

MAX_MESSAGE = 64 * 1024
QUIET = 0.5  # seconds of silence taken to mean nothing more is coming


class StompHerald(Herald):
    """herald with a STOMP listener of its own, and a small message limit."""

    def __init__(self, *extra_args: str):
        self.stomp_port = free_port()
        super().__init__(
            "--stomp-listen",
            f"127.0.0.1:{self.stomp_port}",
            "--max-message-bytes",
            str(MAX_MESSAGE),
            *extra_args,
        )


@pytest.fixture(scope="module")
def herald():
    server = StompHerald()
    yield server
    server.stop_and_check()


@pytest.fixture(scope="module")
def secured():
    with secured_herald('[auth]\naudience = "py"\nleeway_secs = 0\n', StompHerald) as server:
        yield server


class Collector(stomp.ConnectionListener):
    """Everything a stomp.py connection receives, for the test thread to wait on."""

    def __init__(self):
        self.cond = threading.Condition()
        self.messages = []
        self.receipts = []
        self.errors = []
        self.connected = False
        self.disconnected = False

    def _add(self, what):
        with self.cond:
            what()
            self.cond.notify_all()

    def on_connected(self, frame):
        self._add(lambda: setattr(self, "connected", True))

    def on_message(self, frame):
        self._add(lambda: self.messages.append(frame))

    def on_receipt(self, frame):
        self._add(lambda: self.receipts.append(frame.headers["receipt-id"]))

    def on_error(self, frame):
        self._add(lambda: self.errors.append(frame))

    def on_disconnected(self):
        self._add(lambda: setattr(self, "disconnected", True))

    def wait(self, predicate, timeout=STEP, what="the expected frames"):
        with self.cond:
            if not self.cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(
                    f"no {what} within {timeout}s: messages {[m.body for m in self.messages]}, "
                    f"receipts {self.receipts}, errors {[e.headers for e in self.errors]}"
                )

    def messages_after(self, n, timeout=STEP):
        self.wait(lambda c: len(c.messages) >= n, timeout, f"{n} messages")
        return self.messages[:n]

    def receipt(self, rid):
        self.wait(lambda c: rid in c.receipts, what=f"RECEIPT {rid}")


def stomp_tcp(server: StompHerald, passcode: str | None = None, heartbeats=(0, 0)):
    """A connected stomp.py client on herald's STOMP listener, with its collector."""
    conn = stomp.Connection12(
        [("127.0.0.1", server.stomp_port)], auto_decode=False, heartbeats=heartbeats, timeout=STEP
    )
    return start(conn, passcode)


def stomp_ws(server: StompHerald, passcode: str | None = None):
    """A connected stomp.py client on herald's `/stomp` WebSocket, with its collector."""
    conn = WSStompConnection(
        [("127.0.0.1", server.port)],
        ws_path="/stomp",
        header={"Sec-WebSocket-Protocol": "v12.stomp"},
        auto_decode=False,
        binary_mode=True,
        timeout=STEP,
    )
    return start(conn, passcode)


def start(conn, passcode):
    got = Collector()
    conn.set_listener("collector", got)
    conn.connect(passcode=passcode, wait=False, headers={"host": "herald"})
    got.wait(lambda c: c.connected or c.errors, what="CONNECTED")
    return conn, got


def quiet(got: Collector, count: int):
    """Nothing beyond `count` messages arrives for a moment."""
    time.sleep(QUIET)
    with got.cond:
        assert len(got.messages) == count, [m.body for m in got.messages]


BINARY = bytes(range(256)) + b"\x00\x00end\x00"


# --------------------------------------------------------------------------------------------
# STOMP to STOMP
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", [stomp_tcp, stomp_ws], ids=["tcp", "websocket"])
def test_binary_bodies_with_nuls_arrive_byte_for_byte_with_receipts(herald, transport):
    sub, sub_got = transport(herald)
    pub, pub_got = transport(herald)
    assert sub_got.connected and not sub_got.errors
    sub.subscribe("/topic/py/bin", id="s1", headers={"receipt": "sub-1"})
    sub_got.receipt("sub-1")
    pub.send("/topic/py/bin", BINARY, content_type="application/octet-stream", headers={"receipt": "pub-1"})
    pub.send("/topic/py/bin", "text é".encode(), headers={"receipt": "pub-2"})
    pub_got.receipt("pub-1")
    pub_got.receipt("pub-2")
    first, second = sub_got.messages_after(2)
    assert first.body == BINARY
    h = first.headers
    assert (h["subscription"], h["destination"], h["content-type"]) == ("s1", "/topic/py/bin", "application/octet-stream")
    assert int(h["content-length"]) == len(BINARY)
    assert second.body == "text é".encode()
    assert int(second.headers["seq"]) == int(h["seq"]) + 1 and second.headers["epoch"] == h["epoch"]
    assert second.headers["message-id"] != h["message-id"]
    quiet(sub_got, 2)
    for c in (sub, pub):
        c.disconnect(receipt="bye")


def test_a_stamped_send_carries_herald_receive_time(herald):
    """`stamp:true` on a SEND asks for herald's receive time on each MESSAGE (`ts`, µs since
    the UNIX epoch), as a native publish's `"stamp": true` does: it splits latency into legs."""
    sub, sub_got = stomp_tcp(herald)
    pub, _ = stomp_ws(herald)
    sub.subscribe("/topic/py/stamp", id="s", headers={"receipt": "sub"})
    sub_got.receipt("sub")
    before = time.time() * 1e6
    pub.send("/topic/py/stamp", b"stamped", headers={"stamp": "true"})
    pub.send("/topic/py/stamp", b"plain")
    stamped, plain = sub_got.messages_after(2)
    after = time.time() * 1e6
    # herald stamps when its reader woke for the frame: at most a moment before it was sent.
    assert before - 1e6 <= int(stamped.headers["ts"]) <= after
    assert "ts" not in plain.headers
    for c in (sub, pub):
        c.disconnect()


def test_client_individual_acks_give_credit_back(herald):
    sub, got = stomp_tcp(herald)
    pub, _ = stomp_tcp(herald)
    sub.subscribe(
        "/topic/py/credit", id="s", ack="client-individual", headers={"prefetch-count": "2", "receipt": "r"}
    )
    got.receipt("r")
    for i in range(5):
        pub.send("/topic/py/credit", f"m{i}".encode())
    first_two = got.messages_after(2)
    assert [m.body for m in first_two] == [b"m0", b"m1"]
    quiet(got, 2)  # out of credit: the rest wait in herald
    sub.ack(first_two[0].headers["ack"])
    got.messages_after(3)
    quiet(got, 3)
    sub.ack(got.messages[1].headers["ack"])
    sub.ack(got.messages[2].headers["ack"])
    assert [m.body for m in got.messages_after(5)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    quiet(got, 5)
    for c in (sub, pub):
        c.disconnect()


def test_transactions_publish_on_commit_and_not_on_abort(herald):
    sub, got = stomp_tcp(herald)
    pub, pub_got = stomp_tcp(herald)
    sub.subscribe("/topic/py/tx", id="s", headers={"receipt": "r"})
    got.receipt("r")
    kept = pub.begin()
    gone = pub.begin()
    pub.send("/topic/py/tx", b"kept-1", transaction=kept)
    pub.send("/topic/py/tx", b"gone", transaction=gone)
    pub.send("/topic/py/tx", b"kept-2", transaction=kept)
    quiet(got, 0)
    pub.abort(gone)
    pub.commit(kept, headers={"receipt": "c"})
    pub_got.receipt("c")
    assert [m.body for m in got.messages_after(2)] == [b"kept-1", b"kept-2"]
    quiet(got, 2)
    for c in (sub, pub):
        c.disconnect()


# --------------------------------------------------------------------------------------------
# Across protocols
# --------------------------------------------------------------------------------------------


@run_async
async def test_stomp_publishes_reach_a_native_subscriber_in_order(herald):
    ws = await connect(herald)
    await subscribe(ws, "py/cross/out", id=1)
    pub, pub_got = stomp_tcp(herald)
    for i in range(20):
        pub.send("/topic/py/cross/out", BINARY + bytes([i]))
    pub.send("/topic/py/cross/out", b"done", headers={"receipt": "r"})
    await asyncio.to_thread(pub_got.receipt, "r")
    for i in range(20):
        head, body = decode_binary(await recv_frame(ws))
        assert (head["op"], head["topic"], head["seq"]) == ("msg", "py/cross/out", i + 1)
        assert body == BINARY + bytes([i])
    last = await recv_json(ws)
    assert (last["data"], last["seq"]) == ("done", 21)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(ws.recv(), QUIET)
    pub.disconnect()
    await ws.close()


@run_async
async def test_native_and_http_publishes_reach_a_stomp_subscriber_once_in_order(herald):
    sub, got = await asyncio.to_thread(stomp_ws, herald)
    sub.subscribe("/topic/py/cross/in", id="s", headers={"receipt": "r"})
    await asyncio.to_thread(got.receipt, "r")
    ws = await connect(herald)
    sent = []
    for i in range(30):
        if i % 3 == 0:
            body = BINARY + bytes([i])
            r = await asyncio.to_thread(
                requests.post, f"{herald.http}/api/publish/py/cross/in", data=body, timeout=STEP
            )
            assert r.status_code == 200, r.text
        elif i % 3 == 1:
            body = f"native text {i}".encode()
            await send_json(ws, {"op": "pub", "id": i, "topic": "py/cross/in", "data": body.decode()})
            assert (await recv_json(ws))["op"] == "ack"
        else:
            body = b"\x00native binary\x00" + bytes([i])
            await ws.send(encode_binary({"op": "pub", "id": i, "topic": "py/cross/in"}, body))
            assert (await recv_json(ws))["op"] == "ack"
        sent.append(body)
    received = await asyncio.to_thread(got.messages_after, len(sent))
    assert [m.body for m in received] == sent
    assert [int(m.headers["seq"]) for m in received] == list(range(1, 31))
    await asyncio.to_thread(quiet, got, len(sent))
    sub.disconnect()
    await ws.close()


# --------------------------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------------------------


def test_passcode_carries_a_herald_token_and_its_grants(secured):
    sub, got = stomp_tcp(secured, passcode=token(sub=["py/auth/>"]))
    assert got.connected and not got.errors
    pub, pub_got = stomp_tcp(secured, passcode=token(pub=["py/auth/>"]))
    sub.subscribe("/topic/py/auth/a", id="s", headers={"receipt": "r"})
    got.receipt("r")
    pub.send("/topic/py/auth/a", BINARY, headers={"receipt": "p"})
    pub_got.receipt("p")
    assert got.messages_after(1)[0].body == BINARY
    # Beyond its grants: an ERROR, then the close.
    pub.send("/topic/py/other", b"x", headers={"receipt": "q"})
    pub_got.wait(lambda c: c.errors and c.disconnected, what="ERROR then close")
    assert pub_got.errors[0].headers.get("receipt-id") == "q", pub_got.errors[0].headers
    sub.disconnect()


@pytest.mark.parametrize("passcode", [None, "not-a-token", token(sub=["a"], ttl=-10)], ids=["none", "garbage", "expired"])
def test_a_missing_or_bad_passcode_is_an_error_then_the_close(secured, passcode):
    _, got = stomp_tcp(secured, passcode=passcode)
    got.wait(lambda c: c.errors and c.disconnected, what="ERROR then close")
    assert not got.connected
    assert "message" in got.errors[0].headers


# --------------------------------------------------------------------------------------------
# Bad input: ERROR, then the close; nobody else affected
# --------------------------------------------------------------------------------------------


def raw_exchange(server: StompHerald, data: bytes) -> bytes:
    """Sends `data` on a plain socket and returns all herald sends before it closes."""
    with socket.create_connection(("127.0.0.1", server.stomp_port), timeout=STEP) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)  # a timeout raises: herald must close by itself
            if not chunk:
                return out
            out += chunk


CONNECT = b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00"


@pytest.mark.parametrize(
    "data, says",
    [
        (b"SEND\ndestination:/topic/a\n\nhi\x00", b"message:SEND before CONNECT"),
        (CONNECT + b"FROB\n\n\x00", b"unknown command"),
        (CONNECT + b"SEND\ndestination:/topic/a\ncontent-length:2\n\nhiX\x00", b"message:"),
        (CONNECT + b"SEND\ndestination:/topic/a\nx:" + b"h" * (20 * 1024) + b"\n\n\x00", b"message:"),
        (
            CONNECT + b"SEND\ndestination:/topic/a\ncontent-length:%d\n\n" % (MAX_MESSAGE + 1),
            b"message:",
        ),
        (CONNECT + b"SEND\ndestination:/topic/a\n\n" + b"x" * (MAX_MESSAGE + 1), b"message:"),
    ],
    ids=["before-connect", "unknown-command", "unterminated", "oversized-header", "oversized-length", "oversized-body"],
)
def test_bad_input_is_an_error_then_the_close_and_others_keep_receiving(herald, data, says):
    sub, got = stomp_tcp(herald)
    sub.subscribe("/topic/py/bystander", id="s", headers={"receipt": "r"})
    got.receipt("r")
    answer = raw_exchange(herald, data)
    frames = answer.split(b"\x00")
    errors = [f.lstrip(b"\n") for f in frames if f.lstrip(b"\n").startswith(b"ERROR\n")]
    assert len(errors) == 1 and says in errors[0], answer[:400]
    assert answer.rstrip(b"\n").endswith(b"\x00") and frames[-1].strip(b"\n") == b"", "the ERROR is last"
    r = requests.post(f"{herald.http}/api/publish/py/bystander", data=b"still here", timeout=STEP)
    assert r.status_code == 200
    assert got.messages_after(1)[0].body == b"still here"
    sub.disconnect()


@pytest.fixture(scope="module")
def beating():
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "herald.toml")
        with open(config, "w") as f:
            f.write("[limits]\nping_interval_secs = 1\n")
        server = StompHerald("--config", config)
        yield server
        server.stop_and_check()


def test_herald_heart_beats_keep_a_listening_stomp_py_client_connected(beating):
    """stomp.py drops a connection whose server misses its beats (1.5 intervals); herald
    beats every second, also while the client beats to it."""
    conn, got = stomp_tcp(beating, heartbeats=(1000, 1000))
    assert got.connected
    conn.subscribe("/topic/py/beat", id="s")
    time.sleep(3.5)
    assert not got.disconnected and not got.errors
    requests.post(f"{beating.http}/api/publish/py/beat", data=b"alive", timeout=STEP)
    assert got.messages_after(1)[0].body == b"alive"
    conn.disconnect()


@run_async
async def test_websocket_subprotocol_is_echoed_and_frames_may_split_or_share_messages(herald):
    from websockets.asyncio.client import connect as ws_connect

    url = f"ws://127.0.0.1:{herald.port}/stomp"
    ws = await asyncio.wait_for(ws_connect(url, subprotocols=["v11.stomp", "v12.stomp"]), STEP)
    assert ws.subprotocol == "v12.stomp"  # herald's first choice among those offered
    await ws.send(CONNECT[:9])
    await ws.send(CONNECT[9:])
    assert (await recv_frame(ws)).startswith("CONNECTED\nversion:1.2\n")
    sub = b"SUBSCRIBE\nid:s\ndestination:/topic/py/split\n\n\x00"
    send = b"SEND\ndestination:/topic/py/split\ncontent-length:3\n\na\x00b\x00"
    await ws.send(sub + send + send[:20])
    await ws.send(send[20:] + b"SEND\ndestination:/topic/py/split\nreceipt:r\n\nlast\x00")
    got = [await recv_frame(ws) for _ in range(4)]
    got = [g if isinstance(g, bytes) else g.encode() for g in got]
    assert [g.split(b"\n\n", 1)[1] for g in got[:3]] == [b"a\x00b\x00", b"a\x00b\x00", b"last\x00"]
    assert got[3] == b"RECEIPT\nreceipt-id:r\n\n\x00"
    await ws.close()


def test_websocket_refuses_other_subprotocols(herald):
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Protocol": "mqtt",
    }
    r = requests.get(f"{herald.http}/stomp", headers=headers, timeout=STEP)
    assert r.status_code == 400 and "v12.stomp" in r.text
