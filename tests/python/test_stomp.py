"""Third-party test of herald's STOMP (docs/stomp.md) with the `stomp.py` client library.

stomp.py speaks to herald over its TCP listener (`--stomp-listen`) and over WebSocket at
`/stomp`, both also over TLS (certificates from a private CA made with the openssl command);
herald's own protocol (the `websockets` client) and `POST /api/publish` are the other side of
the cross-protocol and resume tests. Bad input is sent on raw sockets, since a client library
will not send it. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
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
        self.receipt_headers = {}
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
        def add():
            self.receipts.append(frame.headers["receipt-id"])
            self.receipt_headers[frame.headers["receipt-id"]] = frame.headers

        self._add(add)

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
        """Waits for RECEIPT `rid`; returns its headers."""
        self.wait(lambda c: rid in c.receipts, what=f"RECEIPT {rid}")
        return self.receipt_headers[rid]


def stomp_tcp(server: StompHerald, passcode: str | None = None, heartbeats=(0, 0), ca: str | None = None):
    """A connected stomp.py client on herald's STOMP listener, with its collector; over TLS
    trusting the CA certificate file `ca` when given."""
    address = ("127.0.0.1", server.stomp_port)
    conn = stomp.Connection12([address], auto_decode=False, heartbeats=heartbeats, timeout=STEP)
    if ca:
        conn.set_ssl(for_hosts=[address], ca_certs=ca)
    return start(conn, passcode)


def stomp_ws(server: StompHerald, passcode: str | None = None, ca: str | None = None):
    """A connected stomp.py client on herald's `/stomp` WebSocket, with its collector; `wss://`
    trusting the CA certificate file `ca` when given."""
    address = ("127.0.0.1", server.port)
    conn = WSStompConnection(
        [address],
        ws_path="/stomp",
        header={"Sec-WebSocket-Protocol": "v12.stomp"},
        auto_decode=False,
        binary_mode=True,
        timeout=STEP,
    )
    if ca:
        conn.set_ssl(for_hosts=[address], ca_certs=ca)
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
# Resuming from a position (docs/stomp.md, "Recovery")
# --------------------------------------------------------------------------------------------


def publish_http(server: StompHerald, topic: str, bodies):
    for body in bodies:
        r = requests.post(f"{server.http}/api/publish/{topic}", data=body, timeout=STEP)
        assert r.status_code == 200, r.text


def position(message) -> str:
    """The `since` value that resumes after `message`: its `seq` and `epoch` headers."""
    return f"{message.headers['seq']}@{message.headers['epoch']}"


def test_resubscribing_since_a_position_replays_what_was_missed_once_in_order_then_live(herald):
    conn, got = stomp_tcp(herald)
    conn.subscribe("/topic/py/resume/a", id="s", headers={"receipt": "first"})
    assert got.receipt("first")["replayed"] == "0"
    publish_http(herald, "py/resume/a", [b"m0", b"m1", BINARY])
    seen = got.messages_after(3)
    assert [m.body for m in seen] == [b"m0", b"m1", BINARY]
    since = position(seen[-1])
    conn.disconnect(receipt="bye")

    publish_http(herald, "py/resume/a", [b"m3", b"\x00m4", b"m5"])  # while away

    conn.connect(wait=True, headers={"host": "herald"})  # the same stomp.py connection, again
    conn.subscribe("/topic/py/resume/a", id="s", headers={"since": since, "receipt": "again"})
    receipt = got.receipt("again")
    assert receipt["replayed"] == "3" and "gap" not in receipt, receipt
    publish_http(herald, "py/resume/a", [b"live"])
    after = got.messages_after(7)[3:]
    assert [m.body for m in after] == [b"m3", b"\x00m4", b"m5", b"live"]
    assert [int(m.headers["seq"]) for m in after] == [4, 5, 6, 7]
    assert {m.headers["epoch"] for m in after} == {seen[0].headers["epoch"]}
    quiet(got, 7)
    conn.disconnect()


@pytest.fixture(scope="module")
def short_history():
    """herald keeping three messages per topic under py/short/."""
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "herald.toml")
        with open(config, "w") as f:
            f.write('[[history]]\npattern = "py/short/>"\nmax_messages = 3\n\n[[history]]\npattern = ">"\n')
        server = StompHerald("--config", config)
        yield server
        server.stop_and_check()


def test_a_gap_history_no_longer_holds_is_named_in_the_receipt(short_history):
    conn, got = stomp_tcp(short_history)
    conn.subscribe("/topic/py/short/a", id="s", headers={"receipt": "r"})
    got.receipt("r")
    publish_http(short_history, "py/short/a", [b"m1", b"m2"])
    since = position(got.messages_after(2)[-1])
    conn.disconnect()
    publish_http(short_history, "py/short/a", [f"m{i}".encode() for i in range(3, 9)])  # only m6-m8 kept

    again, got = stomp_tcp(short_history)
    again.subscribe("/topic/py/short/a", id="s", headers={"since": since, "receipt": "again"})
    receipt = got.receipt("again")
    assert receipt["gap"] == "/topic/py/short/a 3-5 no longer held", receipt
    assert receipt["replayed"] == "3"
    assert [m.body for m in got.messages_after(3)] == [b"m6", b"m7", b"m8"]
    quiet(got, 3)
    again.disconnect()


def test_after_a_restart_the_receipt_says_history_was_lost():
    """herald keeps history in memory: a restart starts every topic in a new epoch."""
    before = StompHerald()
    try:
        conn, got = stomp_tcp(before)
        conn.subscribe("/topic/py/restart/a", id="s", headers={"receipt": "r"})
        got.receipt("r")
        publish_http(before, "py/restart/a", [b"old-1", b"old-2"])
        last = got.messages_after(2)[-1]
        conn.disconnect()
    finally:
        before.stop_and_check()

    after = StompHerald()
    try:
        # Nothing published since the restart: herald holds nothing of the topic.
        conn, got = stomp_tcp(after)
        conn.subscribe("/topic/py/restart/a", id="s", headers={"since": position(last), "receipt": "r1"})
        assert got.receipt("r1")["gap"] == "/topic/py/restart/a nothing held"
        conn.disconnect()

        publish_http(after, "py/restart/a", [b"new-1", b"new-2"])
        conn, got = stomp_tcp(after)
        conn.subscribe("/topic/py/restart/a", id="s", headers={"since": position(last), "receipt": "r2"})
        receipt = got.receipt("r2")
        new = got.messages_after(2)
        epoch = new[0].headers["epoch"]
        assert epoch != last.headers["epoch"]
        assert receipt["gap"] == f"/topic/py/restart/a history lost, numbering restarted in epoch {epoch}", receipt
        assert [(m.body, m.headers["seq"]) for m in new] == [(b"new-1", "1"), (b"new-2", "2")]
        quiet(got, 2)
        conn.disconnect()
    finally:
        after.stop_and_check()


def test_a_wildcard_resumes_with_the_cursor_of_its_first_receipt(herald):
    """`since` names one topic; a wildcard gets everything after its cursor again, topics that
    appeared meanwhile included, and drops the (topic, epoch, seq) it has already seen."""
    conn, got = stomp_tcp(herald)
    conn.subscribe("/topic/py/wild/>", id="w", headers={"receipt": "r"})
    cursor = got.receipt("r")["cursor"]
    publish_http(herald, "py/wild/a", [b"a1"])
    seen = {(m.headers["destination"], m.headers["epoch"], m.headers["seq"]) for m in got.messages_after(1)}
    conn.disconnect()
    publish_http(herald, "py/wild/a", [b"a2"])
    publish_http(herald, "py/wild/new", [b"n1"])

    again, got = stomp_tcp(herald)
    again.subscribe("/topic/py/wild/>", id="w", headers={"cursor": cursor, "receipt": "r"})
    assert "gap" not in got.receipt("r")
    replayed = got.messages_after(3)
    fresh = [m.body for m in replayed if (m.headers["destination"], m.headers["epoch"], m.headers["seq"]) not in seen]
    assert sorted(fresh) == [b"a2", b"n1"]
    quiet(got, 3)
    again.disconnect()


def test_since_on_a_wildcard_is_an_error(herald):
    conn, got = stomp_tcp(herald)
    conn.subscribe("/topic/py/wild/>", id="w", headers={"since": "1@x", "receipt": "r"})
    got.wait(lambda c: c.errors and c.disconnected, what="ERROR then close")
    assert "cursor" in got.errors[0].headers["message"], got.errors[0].headers


# --------------------------------------------------------------------------------------------
# TLS: wss://…/stomp and the STOMP listener, with [tls]
# --------------------------------------------------------------------------------------------


def make_certificates(folder: str) -> tuple[str, str, str]:
    """A private CA and a server certificate it signed for 127.0.0.1, made with the openssl
    command: (CA certificate, server certificate, server key) files."""

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=herald test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(folder, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", "server.ext", "-out", "server.pem")
    return tuple(os.path.join(folder, name) for name in ("ca.pem", "server.pem", "server.key"))


class TlsStompHerald(StompHerald):
    """herald with `[tls]`: https and wss on its listener, TLS on its STOMP listener."""

    scheme = "https"

    def __init__(self, ca: str, cert: str, key: str):
        self.verify = ca
        super().__init__("--tls-cert-file", cert, "--tls-key-file", key)


@pytest.fixture(scope="module")
def tls():
    with tempfile.TemporaryDirectory() as tmp:
        ca, cert, key = make_certificates(tmp)
        server = TlsStompHerald(ca, cert, key)
        yield server
        server.stop_and_check()


@pytest.mark.parametrize("transport", [stomp_tcp, stomp_ws], ids=["tcp", "wss"])
def test_stomp_py_over_tls_round_trips_a_binary_body(tls, transport):
    sub, got = transport(tls, ca=tls.verify)
    pub, pub_got = transport(tls, ca=tls.verify)
    assert got.connected and not got.errors
    sub.subscribe("/topic/py/tls", id="s", headers={"receipt": "r"})
    got.receipt("r")
    pub.send("/topic/py/tls", BINARY, content_type="application/octet-stream", headers={"receipt": "p"})
    pub_got.receipt("p")
    r = requests.post(f"{tls.http}/api/publish/py/tls", data=b"over https", timeout=STEP, verify=tls.verify)
    assert r.status_code == 200, r.text
    assert [m.body for m in got.messages_after(2)] == [BINARY, b"over https"]
    quiet(got, 2)
    for c in (sub, pub):
        c.disconnect()


def test_plain_text_to_the_tls_listeners_fails_cleanly_and_others_keep_receiving(tls):
    sub, got = stomp_tcp(tls, ca=tls.verify)
    sub.subscribe("/topic/py/tls/bystander", id="s", headers={"receipt": "r"})
    got.receipt("r")

    # Plain STOMP to the TLS listener: no handshake, so herald closes; it never answers in
    # plain text.
    answer = raw_exchange(tls, CONNECT + b"SEND\ndestination:/topic/py/tls/bystander\n\nplain\x00")
    assert b"CONNECTED" not in answer and b"plain" not in answer, answer[:200]
    # A plain WebSocket to the wss listener: the upgrade fails.
    plain = WSStompConnection([("127.0.0.1", tls.port)], ws_path="/stomp", timeout=STEP, reconnect_attempts_max=1)
    with pytest.raises(stomp.exception.ConnectFailedException):
        plain.connect(wait=True)

    r = requests.post(f"{tls.http}/api/publish/py/tls/bystander", data=b"still here", timeout=STEP, verify=tls.verify)
    assert r.status_code == 200
    assert [m.body for m in got.messages_after(1)] == [b"still here"]
    quiet(got, 1)
    sub.disconnect()


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


def test_a_heart_beating_publisher_held_by_a_lossless_subscriber_is_not_idle(beating):
    """herald stops reading a publisher while a lossless subscriber has no credit for its
    message; the beats the publisher sends meanwhile wait in the socket, so that wait does not
    count as the publisher's silence (herald closes a client after two silent intervals)."""
    sub, got = stomp_tcp(beating)
    sub.subscribe("/topic/py/held", id="s", ack="client-individual", headers={"prefetch-count": "1", "receipt": "r"})
    got.receipt("r")
    pub, pub_got = stomp_tcp(beating, heartbeats=(1000, 1000))
    pub.send("/topic/py/held", b"first")
    pub.send("/topic/py/held", b"held", headers={"receipt": "held"})
    first = got.messages_after(1)[0]
    time.sleep(3)  # longer than two of the publisher's intervals
    assert not pub_got.disconnected and "held" not in pub_got.receipts
    sub.ack(first.headers["ack"])
    pub_got.receipt("held")
    assert [m.body for m in got.messages_after(2)] == [b"first", b"held"]
    assert not pub_got.disconnected and not pub_got.errors
    for c in (sub, pub):
        c.disconnect()


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
