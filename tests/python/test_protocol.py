"""Third-party conformance test for herald's native protocol (docs/protocol.md).

Speaks only what the spec says, over real loopback sockets, with the `websockets` asyncio
client and `requests`. Every wait is bounded, so a broken server fails a test instead of
hanging it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest
import requests
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

HERALD_BIN = os.environ.get("HERALD_BIN", "/work/main/target/release/herald")

STEP = 3.0  # seconds allowed for any single network step
TEST_BUDGET = 20.0  # seconds allowed for a whole test body
STARTUP = 10.0  # seconds for the server to become healthy / to exit


# --------------------------------------------------------------------------------------------
# The server under test
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Herald:
    """One `herald serve` process on a free loopback port."""

    scheme = "http"  # "https" for a subclass that serves TLS
    verify: bool | str = True  # what `requests` trusts: a subclass serving TLS names its CA

    def __init__(self, *extra_args: str):
        if not os.access(HERALD_BIN, os.X_OK):
            pytest.fail(f"no herald binary at {HERALD_BIN}: run `cargo build --release -p herald` or set HERALD_BIN")
        self.port = free_port()
        self.http = f"{self.scheme}://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [HERALD_BIN, "serve", "--listen", f"127.0.0.1:{self.port}", *extra_args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = self.output()
                self.close()
                pytest.fail(f"herald exited early ({self.proc.returncode}):\n{output}")
            try:
                if requests.get(f"{self.http}/healthz", timeout=1, verify=self.verify).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        output = self.output()
        self.close()
        pytest.fail(f"herald did not answer /healthz within {STARTUP}s:\n{output}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def terminate(self) -> int:
        """SIGTERM, then the exit code (killing it and failing if it takes over STARTUP s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STARTUP)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STARTUP)
            pytest.fail(f"herald did not exit within {STARTUP}s of SIGTERM:\n{self.output()}")

    def stop_and_check(self) -> None:
        """SIGTERM; the server must exit 0. Releases the log either way."""
        try:
            code = self.terminate()
            assert code == 0, f"herald exited with {code} after SIGTERM:\n{self.output()}"
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STARTUP)
        self.log.close()


@pytest.fixture(scope="module")
def herald():
    server = Herald()
    yield server
    server.stop_and_check()


def run_async(fn):
    """Run an `async def` test body to completion, bounded by TEST_BUDGET seconds."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), TEST_BUDGET))

    return wrapper


# --------------------------------------------------------------------------------------------
# Protocol helpers
# --------------------------------------------------------------------------------------------


async def connect(server: Herald):
    return await asyncio.wait_for(ws_connect(server.ws_url, max_size=None), STEP)


async def send_json(ws, obj) -> None:
    await asyncio.wait_for(ws.send(json.dumps(obj)), STEP)


async def recv_frame(ws):
    return await asyncio.wait_for(ws.recv(), STEP)


async def recv_json(ws) -> dict:
    """The next frame, which must be a text frame holding a JSON object."""
    frame = await recv_frame(ws)
    assert isinstance(frame, str), f"expected a text frame, got binary {frame[:80]!r}"
    obj = json.loads(frame)
    assert isinstance(obj, dict), f"expected a JSON object, got {frame!r}"
    return obj


async def recv_msg(ws) -> dict:
    """The next frame, which must be a text `msg`."""
    obj = await recv_json(ws)
    assert obj.get("op") == "msg", f"expected a msg, got {obj}"
    return obj


def encode_binary(header: dict, payload: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + payload


def decode_binary(frame: bytes) -> tuple[dict, bytes]:
    assert len(frame) >= 4, f"binary frame too short: {frame!r}"
    (n,) = struct.unpack(">I", frame[:4])
    assert 4 + n <= len(frame), f"header length {n} exceeds the frame ({len(frame)} bytes)"
    header = json.loads(frame[4 : 4 + n].decode("utf-8"))
    assert isinstance(header, dict)
    return header, frame[4 + n :]


async def recv_binary(ws) -> tuple[dict, bytes]:
    frame = await recv_frame(ws)
    assert isinstance(frame, bytes), f"expected a binary frame, got text {frame[:200]!r}"
    return decode_binary(frame)


async def subscribe(ws, topic: str, id=None, **fields) -> dict:
    """Subscribe and return the reply, which must be `subscribed` for this topic."""
    req = {"op": "sub", "topic": topic, **fields}
    if id is not None:
        req["id"] = id
    await send_json(ws, req)
    reply = await recv_json(ws)
    assert reply.get("op") == "subscribed", f"expected subscribed, got {reply}"
    assert reply["topic"] == topic
    if id is not None:
        assert reply["id"] == id
    return reply


async def publish(ws, topic: str, data: str, id, **fields) -> dict:
    """Publish with an id and return the ack."""
    await send_json(ws, {"op": "pub", "id": id, "topic": topic, "data": data, **fields})
    ack = await recv_json(ws)
    assert (ack.get("op"), ack.get("id"), ack.get("topic")) == ("ack", id, topic), ack
    assert isinstance(ack.get("seq"), int) and ack["seq"] >= 1, ack
    return ack


_ping_ids = iter(range(1, 1 << 30))


async def assert_alive(ws) -> None:
    """A ping is answered by the matching pong, and it is the very next frame."""
    ping_id = next(_ping_ids)
    await send_json(ws, {"op": "ping", "id": ping_id})
    assert await recv_json(ws) == {"op": "pong", "id": ping_id}


async def expect_close(ws) -> tuple[int, str]:
    """Wait for the server's close frame; return its (code, reason)."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), STEP)
    except ConnectionClosed as e:
        assert e.rcvd is not None, f"connection ended without a close frame from the server ({e})"
        return e.rcvd.code, e.rcvd.reason


# --------------------------------------------------------------------------------------------
# 1. Subscribe, publish, receive
# --------------------------------------------------------------------------------------------


@run_async
async def test_subscribe_then_text_publish_is_delivered_with_rising_seq(herald):
    sub, pub = await connect(herald), await connect(herald)
    reply = await subscribe(sub, "basic/room", id=1)
    assert reply["recovered"] is True
    assert reply.get("replayed", 0) == 0
    assert not reply.get("gaps")

    epochs = set()
    for seq, data in enumerate(["hello", "wörld ✓", ""], start=1):
        await send_json(pub, {"op": "pub", "topic": "basic/room", "data": data})
        msg = await recv_msg(sub)
        assert msg["topic"] == "basic/room"
        assert msg["seq"] == seq  # 1, 2, 3: starts at 1, rises by exactly one
        assert msg["data"] == data
        assert isinstance(msg["epoch"], str) and msg["epoch"]
        assert "ct" not in msg and "ts" not in msg, msg  # neither was asked for
        epochs.add(msg["epoch"])
    assert len(epochs) == 1

    await send_json(pub, {"op": "pub", "topic": "basic/room", "data": "x", "ct": "text/x-test"})
    msg = await recv_msg(sub)
    assert (msg["seq"], msg["ct"], msg["data"]) == (4, "text/x-test", "x")
    await sub.close()
    await pub.close()


@run_async
async def test_string_request_ids_are_echoed_and_unknown_fields_ignored(herald):
    ws = await connect(herald)
    reply = await subscribe(ws, "basic/ids", id="sub-α", future_field={"x": 1})
    assert reply["recovered"] is True
    await send_json(ws, {"op": "ping", "id": "p-1", "extra": True})
    assert await recv_json(ws) == {"op": "pong", "id": "p-1"}
    await ws.close()


@run_async
async def test_unsubscribe_stops_delivery(herald):
    sub, pub = await connect(herald), await connect(herald)
    await subscribe(sub, "basic/unsub", id=1)
    await publish(pub, "basic/unsub", "one", id=1)
    assert (await recv_msg(sub))["data"] == "one"
    await send_json(sub, {"op": "unsub", "id": 2, "topic": "basic/unsub"})
    assert await recv_json(sub) == {"op": "unsubscribed", "id": 2, "topic": "basic/unsub"}
    await publish(pub, "basic/unsub", "two", id=2)
    await asyncio.sleep(0.1)
    await assert_alive(sub)  # the pong is next: "two" was not delivered
    await sub.close()
    await pub.close()


# --------------------------------------------------------------------------------------------
# 2. Wildcards
# --------------------------------------------------------------------------------------------


@run_async
async def test_wildcards_and_overlapping_subscriptions_deliver_each_message_once(herald):
    a, b, pub = await connect(herald), await connect(herald), await connect(herald)
    await subscribe(a, "a/*/c", id=1)
    await subscribe(a, "a/>", id=2)
    await subscribe(b, "a/*/c", id=1)
    await subscribe(b, "a/b/>", id=2)

    published = [
        "a/b/c",  # a: both patterns; b: both patterns
        "a/x/c",  # a: both; b: a/*/c
        "a/b/x/c",  # a: a/>; b: a/b/>  (a/*/c: * is one level only)
        "a/x/y/c",  # a: a/>; b: none   (* never matches two levels)
        "a/c",  # a: a/>; b: none   (* never matches zero levels)
        "a/b",  # a: a/>; b: none   (> needs at least one level)
        "a",  # nobody: a/> needs at least one level after a
        "b/b/c",  # nobody
        "a/ab*/c",  # a: both; b: a/*/c  (ab* is an ordinary level, publishable)
        "a/b/c",  # the end marker
    ]
    for i, topic in enumerate(published):
        await publish(pub, topic, f"m{i}", id=i)

    async def drain(ws, count):
        return [(m["topic"], m["data"]) for m in [await recv_msg(ws) for _ in range(count)]]

    expected_a = [(t, f"m{i}") for i, t in enumerate(published) if i not in (6, 7)]
    expected_b = [(t, f"m{i}") for i, t in enumerate(published) if i in (0, 1, 2, 8, 9)]
    assert await drain(a, len(expected_a)) == expected_a
    assert await drain(b, len(expected_b)) == expected_b
    # Nothing else (no duplicate) is queued behind the end marker.
    await assert_alive(a)
    await assert_alive(b)
    for ws in (a, b, pub):
        await ws.close()


@run_async
async def test_subscribing_twice_to_the_same_pattern_delivers_once(herald):
    sub, pub = await connect(herald), await connect(herald)
    first = await subscribe(sub, "twice/*", id=1)
    second = await subscribe(sub, "twice/*", id=2)
    assert first["recovered"] is True and second["recovered"] is True
    await publish(pub, "twice/x", "once", id=1)
    await publish(pub, "twice/x", "end", id=2)
    assert (await recv_msg(sub))["data"] == "once"
    assert (await recv_msg(sub))["data"] == "end"
    await assert_alive(sub)
    await sub.close()
    await pub.close()


@run_async
async def test_gt_alone_matches_every_topic(herald):
    sub, pub = await connect(herald), await connect(herald)
    await subscribe(sub, ">", id=1)
    topics = ["everything", "everything/a/b/c/d"]
    for i, t in enumerate(topics):
        await publish(pub, t, str(i), id=i)
    got = [(await recv_msg(sub))["topic"] for _ in topics]
    assert got == topics
    await sub.close()
    await pub.close()


@run_async
async def test_message_frames_are_identical_for_every_subscriber(herald):
    subs = [await connect(herald) for _ in range(3)]
    await subscribe(subs[0], "same/x", id=1)
    await subscribe(subs[1], "same/*", id=1)
    await subscribe(subs[2], ">", id=1)
    await subscribe(subs[2], "same/>", id=2)
    pub = await connect(herald)
    await publish(pub, "same/x", "text", id=1, ct="text/plain", stamp=True)
    await asyncio.wait_for(pub.send(encode_binary({"op": "pub", "topic": "same/x", "id": 2}, b"\x01\x02")), STEP)
    await recv_json(pub)
    for kind in (str, bytes):
        frames = [await recv_frame(ws) for ws in subs]
        assert all(isinstance(f, kind) for f in frames)
        assert frames[0] == frames[1] == frames[2]
    for ws in subs + [pub]:
        await ws.close()


# --------------------------------------------------------------------------------------------
# 3. Acks and publish errors
# --------------------------------------------------------------------------------------------


@run_async
async def test_publish_with_id_is_acked_without_id_is_silent(herald):
    ws = await connect(herald)
    await send_json(ws, {"op": "pub", "id": 3, "topic": "ack/t", "data": "a"})
    assert await recv_json(ws) == {"op": "ack", "id": 3, "topic": "ack/t", "seq": 1}
    await send_json(ws, {"op": "pub", "id": "three", "topic": "ack/t", "data": "b"})
    assert await recv_json(ws) == {"op": "ack", "id": "three", "topic": "ack/t", "seq": 2}

    await send_json(ws, {"op": "pub", "topic": "ack/t", "data": "silent"})
    await assert_alive(ws)  # the pong is the next frame: no ack came back

    await send_json(ws, {"op": "pub", "id": 4, "topic": "ack/t", "data": "c"})
    assert (await recv_json(ws))["seq"] == 4  # the silent publish did happen (seq 3)
    await ws.close()


@pytest.mark.parametrize("pattern", ["ack/*", "ack/>", "*/x", ">"])
@run_async
async def test_publish_to_pattern_is_an_error(herald, pattern):
    ws = await connect(herald)
    await send_json(ws, {"op": "pub", "id": 7, "topic": pattern, "data": "no"})
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == "publish_to_pattern", err
    assert err["id"] == 7
    assert isinstance(err["message"], str) and err["message"]
    await assert_alive(ws)
    await ws.close()


# --------------------------------------------------------------------------------------------
# 4. Binary publish over WebSocket
# --------------------------------------------------------------------------------------------


@run_async
async def test_binary_publish_round_trips_every_byte_value(herald):
    sub, pub = await connect(herald), await connect(herald)
    await subscribe(sub, "camera/*/raw", id=1)
    payload = bytes(range(256)) * 2
    header = {"op": "pub", "topic": "camera/1/raw", "ct": "image/fits", "id": 7}
    await asyncio.wait_for(pub.send(encode_binary(header, payload)), STEP)
    assert await recv_json(pub) == {"op": "ack", "id": 7, "topic": "camera/1/raw", "seq": 1}

    head, body = await recv_binary(sub)
    assert head["op"] == "msg"
    assert head["topic"] == "camera/1/raw"
    assert head["seq"] == 1
    assert isinstance(head["epoch"], str) and head["epoch"]
    assert head["ct"] == "image/fits"
    assert "ts" not in head
    assert body == payload

    # An empty binary payload is still a message.
    await asyncio.wait_for(pub.send(encode_binary({"op": "pub", "topic": "camera/1/raw"}, b"")), STEP)
    head, body = await recv_binary(sub)
    assert (head["seq"], body) == (2, b"")
    assert "ct" not in head
    await sub.close()
    await pub.close()


# --------------------------------------------------------------------------------------------
# 5. Publish over HTTP
# --------------------------------------------------------------------------------------------


def http_post(server: Herald, path: str, body: bytes, content_type: str | None):
    headers = {"Content-Type": content_type} if content_type else {}
    return requests.post(f"{server.http}{path}", data=body, headers=headers, timeout=STEP)


@run_async
async def test_http_publish_binary_body_arrives_byte_for_byte(herald):
    sub = await connect(herald)
    await subscribe(sub, "http/bin", id=1)
    payload = random.Random(1234).randbytes(100 * 1024)
    r = await asyncio.to_thread(http_post, herald, "/api/publish/http/bin", payload, "application/x-herald-test")
    assert r.status_code == 200, r.text
    assert r.json() == {"topic": "http/bin", "seq": 1, "deliveries": 1}

    head, body = await recv_binary(sub)
    assert head["op"] == "msg" and head["topic"] == "http/bin" and head["seq"] == 1
    assert isinstance(head["epoch"], str)
    assert head["ct"] == "application/x-herald-test"
    assert body == payload
    await sub.close()


@run_async
async def test_http_publish_text_body_arrives_as_text_msg(herald):
    sub = await connect(herald)
    await subscribe(sub, "http/text/*", id=1)
    text = "héllo, wörld ✓ 𝄞"
    r = await asyncio.to_thread(http_post, herald, "/api/publish/http/text/plain", text.encode(), "text/plain")
    assert r.status_code == 200, r.text
    assert r.json() == {"topic": "http/text/plain", "seq": 1, "deliveries": 1}
    msg = await recv_msg(sub)
    assert msg["topic"] == "http/text/plain" and msg["seq"] == 1
    assert msg["data"] == text and msg["ct"] == "text/plain"

    doc = b'{"price": 1.0842}'
    r = await asyncio.to_thread(http_post, herald, "/api/publish/http/text/json", doc, "application/json")
    assert r.status_code == 200
    msg = await recv_msg(sub)
    assert msg["data"] == doc.decode() and msg["ct"] == "application/json"

    # text/* but not valid UTF-8: delivered as binary.
    raw = b"\xff\xfe bytes"
    r = await asyncio.to_thread(http_post, herald, "/api/publish/http/text/raw", raw, "text/plain")
    assert r.status_code == 200
    head, body = await recv_binary(sub)
    assert head["topic"] == "http/text/raw" and body == raw and head["ct"] == "text/plain"
    await sub.close()


def test_http_publish_without_topic_is_400(herald):
    r = http_post(herald, "/api/publish/", b"x", "text/plain")
    assert r.status_code == 400
    err = r.json()
    assert isinstance(err["code"], str) and err["code"]
    assert isinstance(err["message"], str) and err["message"]


@pytest.mark.parametrize("path", ["a//b", "a/", "x/*", "x/>"])
def test_http_publish_to_invalid_topic_is_400(herald, path):
    r = http_post(herald, f"/api/publish/{path}", b"x", "text/plain")
    assert r.status_code == 400, (r.status_code, r.text)
    expected = "publish_to_pattern" if path.startswith("x/") else "invalid_topic"
    assert r.json()["code"] == expected
    assert r.json()["message"]


# --------------------------------------------------------------------------------------------
# 6. Stamps
# --------------------------------------------------------------------------------------------


@run_async
async def test_stamp_adds_receive_time_in_microseconds(herald):
    sub, pub = await connect(herald), await connect(herald)
    await subscribe(sub, "stamp/t", id=1)
    before = time.time_ns() // 1000
    await publish(pub, "stamp/t", "now", id=1, stamp=True)
    after = time.time_ns() // 1000
    msg = await recv_msg(sub)
    assert isinstance(msg["ts"], int) and not isinstance(msg["ts"], bool)
    assert before - 2_000_000 <= msg["ts"] <= after + 2_000_000, (before, msg["ts"], after)

    await publish(pub, "stamp/t", "bin", id=2)
    await asyncio.wait_for(pub.send(encode_binary({"op": "pub", "topic": "stamp/t", "stamp": True}, b"\x00")), STEP)
    assert "ts" not in await recv_msg(sub)  # not asked for: absent
    head, _ = await recv_binary(sub)
    assert isinstance(head["ts"], int) and abs(head["ts"] - time.time_ns() // 1000) < 5_000_000
    await sub.close()
    await pub.close()


# --------------------------------------------------------------------------------------------
# 7. Snapshot
# --------------------------------------------------------------------------------------------


@run_async
async def test_snapshot_delivers_last_values_after_the_reply(herald):
    pub = await connect(herald)
    for i in (1, 2, 3):
        await publish(pub, "s/1", f"s1-{i}", id=i)
    await publish(pub, "s/2", "s2-1", id=4)

    sub = await connect(herald)
    reply = await subscribe(sub, "s/*", id=9, snapshot=True)  # the reply comes first
    assert reply["replayed"] == 2
    got = {m["topic"]: m for m in [await recv_msg(sub), await recv_msg(sub)]}
    assert set(got) == {"s/1", "s/2"}
    assert (got["s/1"]["seq"], got["s/1"]["data"]) == (3, "s1-3")
    assert (got["s/2"]["seq"], got["s/2"]["data"]) == (1, "s2-1")
    await assert_alive(sub)  # nothing else was replayed

    await publish(pub, "s/1", "s1-4", id=5)  # then live
    assert (await recv_msg(sub))["seq"] == 4
    await sub.close()
    await pub.close()


@run_async
async def test_snapshot_excepts_topics_named_in_since(herald):
    pub = await connect(herald)
    for i in (1, 2, 3):
        await publish(pub, "sx/a", f"a{i}", id=i)
    ack = await publish(pub, "sx/b", "b1", id=4)
    epoch_probe = await connect(herald)
    await subscribe(epoch_probe, "sx/a", id=1)
    await publish(pub, "sx/a", "a4", id=5)
    epoch = (await recv_msg(epoch_probe))["epoch"]
    await epoch_probe.close()

    sub = await connect(herald)
    reply = await subscribe(sub, "sx/*", id=1, snapshot=True, since={"sx/a": {"seq": 2, "epoch": epoch}})
    # sx/a is replayed from its position (3, 4), not snapshotted; sx/b gets its last value.
    assert reply["recovered"] is True
    assert reply["replayed"] == 3
    got = [await recv_msg(sub) for _ in range(3)]
    a = [(m["seq"], m["data"]) for m in got if m["topic"] == "sx/a"]
    b = [(m["seq"], m["data"]) for m in got if m["topic"] == "sx/b"]
    assert a == [(3, "a3"), (4, "a4")]
    assert b == [(ack["seq"], "b1")]
    await assert_alive(sub)
    await sub.close()
    await pub.close()


@pytest.fixture(scope="module")
def last_value_only():
    """A herald whose `lv/` topics keep only their last value, as the filtering scenario's
    unsubscribed topics do: a message nobody receives there is kept as published."""
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "herald.toml")
        with open(config, "w") as f:
            f.write('[[history]]\npattern = "lv/>"\nmax_messages = 0\n')
        server = Herald("--config", config)
        yield server
        server.stop_and_check()


@run_async
async def test_snapshot_of_messages_nobody_received_carries_them_whole(last_value_only):
    pub = await connect(last_value_only)
    await publish(pub, "lv/text", "older", id=1)
    before = time.time_ns() // 1000
    text = await publish(pub, "lv/text", 'a "quoted"\nline', id=2, ct="text/plain", stamp=True)
    long = await publish(pub, "lv/long", "é" * 600, id=3)  # past what is kept inline
    image = bytes(range(256)) * 3
    header = {"op": "pub", "topic": "lv/bin", "ct": "image/fits", "id": 4}
    await asyncio.wait_for(pub.send(encode_binary(header, image)), STEP)
    assert (await recv_json(pub))["seq"] == 1

    sub = await connect(last_value_only)
    reply = await subscribe(sub, "lv/*", id=9, snapshot=True)
    assert reply["replayed"] == 3
    head, body = await recv_binary(sub)  # topics come in name order
    assert (head["topic"], head["seq"], head["ct"], body) == ("lv/bin", 1, "image/fits", image)
    assert "ts" not in head
    got = await recv_msg(sub)
    assert (got["topic"], got["seq"], got["data"]) == ("lv/long", long["seq"], "é" * 600)
    got = await recv_msg(sub)
    assert (got["topic"], got["seq"], got["data"], got["ct"]) == ("lv/text", 2, 'a "quoted"\nline', "text/plain")
    assert text["seq"] == 2 and before - 2_000_000 <= got["ts"] <= time.time_ns() // 1000 + 2_000_000
    assert isinstance(got["epoch"], str) and got["epoch"]
    await assert_alive(sub)

    await publish(pub, "lv/text", "live", id=5)  # then live, numbered on
    got = await recv_msg(sub)
    assert (got["seq"], got["data"]) == (3, "live")
    await sub.close()
    await pub.close()


# --------------------------------------------------------------------------------------------
# 8. Recovery
# --------------------------------------------------------------------------------------------


async def publish_series(server: Herald, topic: str, seqs) -> None:
    pub = await connect(server)
    for n in seqs:
        ack = await publish(pub, topic, f"m{n}", id=n)
        assert ack["seq"] == n
    await pub.close()


@run_async
async def test_recovery_replays_what_was_missed_then_goes_live(herald):
    pub = await connect(herald)
    sub = await connect(herald)
    await subscribe(sub, "r/1", id=1)
    for n in (1, 2, 3):
        await publish(pub, "r/1", f"m{n}", id=n)
    seen = [await recv_msg(sub) for _ in range(3)]
    assert [m["seq"] for m in seen] == [1, 2, 3]
    epoch = seen[-1]["epoch"]
    await sub.close()

    for n in (4, 5, 6):
        await publish(pub, "r/1", f"m{n}", id=n)

    sub = await connect(herald)
    reply = await subscribe(sub, "r/1", id=2, since={"r/1": {"seq": 3, "epoch": epoch}})
    assert reply["recovered"] is True
    assert reply["replayed"] == 3
    assert not reply.get("gaps")
    replayed = [await recv_msg(sub) for _ in range(3)]
    assert [(m["seq"], m["data"], m["epoch"]) for m in replayed] == [
        (4, "m4", epoch),
        (5, "m5", epoch),
        (6, "m6", epoch),
    ]
    await publish(pub, "r/1", "m7", id=7)
    live = await recv_msg(sub)
    assert (live["seq"], live["data"]) == (7, "m7")
    await sub.close()
    await pub.close()


@run_async
async def test_recovery_with_a_wrong_epoch_reports_epoch_changed(herald):
    await publish_series(herald, "r/2", [1, 2, 3])
    sub = await connect(herald)
    reply = await subscribe(sub, "r/2", id=1, since={"r/2": {"seq": 2, "epoch": "not-the-epoch"}})
    assert reply["recovered"] is False
    gaps = reply["gaps"]
    assert len(gaps) == 1 and gaps[0]["topic"] == "r/2" and gaps[0]["reason"] == "epoch_changed", gaps
    # Everything held of the current epoch is replayed, under the epoch the gap names.
    assert reply["replayed"] == 3
    msgs = [await recv_msg(sub) for _ in range(3)]
    assert [m["seq"] for m in msgs] == [1, 2, 3]
    assert all(m["epoch"] == gaps[0]["epoch"] for m in msgs)
    await assert_alive(sub)
    await sub.close()


@run_async
async def test_recovery_of_an_unknown_topic_reports_unknown_topic(herald):
    await publish_series(herald, "r3/known", [1])
    sub = await connect(herald)
    reply = await subscribe(sub, "r3/*", id=1, since={"r3/never": {"seq": 5, "epoch": "whatever"}})
    assert reply["recovered"] is False
    gaps = reply["gaps"]
    assert len(gaps) == 1 and gaps[0]["topic"] == "r3/never" and gaps[0]["reason"] == "unknown_topic", gaps
    # No cursor: every other topic the pattern matches is recovered from the beginning.
    assert reply["replayed"] == 1
    msg = await recv_json(sub)
    assert (msg["topic"], msg["seq"], msg["data"]) == ("r3/known", 1, "m1")
    await assert_alive(sub)
    await sub.close()


@run_async
async def test_a_wildcard_recovers_a_topic_first_published_while_away(herald):
    """A topic that appeared under the pattern while the client was away is replayed from the
    subscription's cursor, and the reply says recovered only because nothing is missing."""
    sub = await connect(herald)
    first = await subscribe(sub, "w5/>", id=1)
    cursor = first["cursor"]
    assert isinstance(cursor, str) and cursor
    await publish_series(herald, "w5/a", [1])
    a1 = await recv_json(sub)
    await sub.close()
    await publish_series(herald, "w5/b", [1, 2])
    await publish_series(herald, "w5/a", [2])
    again = await connect(herald)
    since = {"w5/a": {"seq": a1["seq"], "epoch": a1["epoch"]}}
    reply = await subscribe(again, "w5/>", id=2, since=since, cursor=cursor)
    assert reply["recovered"] is True and reply["replayed"] == 3, reply
    got = [await recv_json(again) for _ in range(3)]
    assert [(m["topic"], m["data"]) for m in got] == [("w5/a", "m2"), ("w5/b", "m1"), ("w5/b", "m2")]
    await assert_alive(again)
    await again.close()


# --------------------------------------------------------------------------------------------
# 9. Request errors (the connection survives every one)
# --------------------------------------------------------------------------------------------

LONG = "t/" + "x" * 248  # 250 bytes: the longest valid topic
assert len(LONG.encode()) == 250

ERROR_CASES = [
    # (name, text frame to send, expected code, expected id or None)
    ("malformed_json", '{"op":"sub","id":1,', "bad_json", None),
    ("not_an_object", "[1, 2, 3]", "bad_json", None),
    ("unknown_op", '{"op":"frobnicate","id":42}', "unknown_op", 42),
    ("missing_op", '{"id":"no-op"}', "unknown_op", "no-op"),
    ("sub_missing_topic", '{"op":"sub","id":5}', "missing_field", 5),
    ("pub_missing_topic", '{"op":"pub","id":6,"data":"x"}', "missing_field", 6),
    ("pub_missing_data", '{"op":"pub","id":7,"topic":"e/t"}', "missing_field", 7),
    ("sub_empty_level", '{"op":"sub","id":8,"topic":"a//b"}', "invalid_topic", 8),
    ("sub_leading_slash", '{"op":"sub","id":9,"topic":"/a"}', "invalid_topic", 9),
    ("sub_trailing_slash", '{"op":"sub","id":10,"topic":"a/"}', "invalid_topic", 10),
    ("sub_251_bytes", json.dumps({"op": "sub", "id": 11, "topic": LONG + "y"}), "invalid_topic", 11),
    ("sub_gt_not_last", '{"op":"sub","id":12,"topic":"a/>/b"}', "invalid_topic", 12),
    ("pub_empty_level", '{"op":"pub","id":13,"topic":"a//b","data":"x"}', "invalid_topic", 13),
    ("pub_251_bytes", json.dumps({"op": "pub", "id": 14, "topic": "é" * 125 + "x", "data": "x"}), "invalid_topic", 14),
    ("pub_nul", json.dumps({"op": "pub", "id": 15, "topic": "a/\u0000", "data": "x"}), "invalid_topic", 15),
    ("unsub_not_held", '{"op":"unsub","id":16,"topic":"never/held"}', "not_subscribed", 16),
]


@pytest.mark.parametrize(
    "frame,code,req_id", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
@run_async
async def test_request_error_is_reported_and_connection_survives(herald, frame, code, req_id):
    ws = await connect(herald)
    await asyncio.wait_for(ws.send(frame), STEP)
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == code, err
    if req_id is None:
        assert "id" not in err
    else:
        assert err["id"] == req_id
    assert isinstance(err["message"], str) and err["message"]
    await assert_alive(ws)
    await ws.close()


@run_async
async def test_field_of_wrong_type_is_bad_json(herald):
    ws = await connect(herald)
    await send_json(ws, {"op": "sub", "id": 20, "topic": 7})
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == "bad_json", err
    await send_json(ws, {"op": "pub", "id": 21, "topic": "e/t", "data": 123})
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == "bad_json", err
    await assert_alive(ws)
    await ws.close()


@run_async
async def test_longest_valid_topic_is_accepted(herald):
    sub, pub = await connect(herald), await connect(herald)
    await subscribe(sub, LONG, id=1)
    await publish(pub, LONG, "edge", id=2)
    msg = await recv_msg(sub)
    assert (msg["topic"], msg["data"]) == (LONG, "edge")
    await sub.close()
    await pub.close()


BAD_BINARY = [
    ("two_bytes", b"\x00\x01"),
    ("header_longer_than_frame", struct.pack(">I", 1000) + b'{"op":"pub","topic":"x"}'),
    ("header_not_json", struct.pack(">I", 5) + b"hello" + b"payload"),
    ("header_not_an_object", struct.pack(">I", 2) + b"[]" + b"payload"),
]


@pytest.mark.parametrize("frame", [c[1] for c in BAD_BINARY], ids=[c[0] for c in BAD_BINARY])
@run_async
async def test_bad_binary_frame_is_reported_and_connection_survives(herald, frame):
    ws = await connect(herald)
    await asyncio.wait_for(ws.send(frame), STEP)
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == "bad_frame", err
    assert err["message"]
    await assert_alive(ws)
    await ws.close()


@run_async
async def test_many_errors_in_a_row_on_one_connection(herald):
    ws = await connect(herald)
    for _, frame, code, _ in ERROR_CASES:
        await asyncio.wait_for(ws.send(frame), STEP)
        assert (await recv_json(ws))["code"] == code
    for _, frame in BAD_BINARY:
        await asyncio.wait_for(ws.send(frame), STEP)
        assert (await recv_json(ws))["code"] == "bad_frame"
    await assert_alive(ws)
    await ws.close()


@run_async
async def test_websocket_ping_frames_are_answered(herald):
    ws = await connect(herald)
    pong = await ws.ping(b"are you there")
    latency = await asyncio.wait_for(pong, STEP)
    assert latency >= 0
    await ws.close()


@run_async
async def test_fragmented_messages_are_reassembled(herald):
    sub, pub = await connect(herald), await connect(herald)
    await subscribe(sub, "frag/t", id=1)
    request = json.dumps({"op": "pub", "id": 1, "topic": "frag/t", "data": "pieced ✓ together"})
    await asyncio.wait_for(pub.send([request[:10], request[10:25], request[25:]]), STEP)
    assert await recv_json(pub) == {"op": "ack", "id": 1, "topic": "frag/t", "seq": 1}
    assert (await recv_msg(sub))["data"] == "pieced ✓ together"

    frame = encode_binary({"op": "pub", "topic": "frag/t"}, bytes(range(256)))
    await asyncio.wait_for(pub.send([frame[:3], frame[3:40], frame[40:]]), STEP)
    head, body = await recv_binary(sub)
    assert (head["seq"], body) == (2, bytes(range(256)))
    await sub.close()
    await pub.close()


# --------------------------------------------------------------------------------------------
# 10. Frames the server closes the connection for
# --------------------------------------------------------------------------------------------


@run_async
async def test_invalid_utf8_text_frame_closes_with_1007(herald):
    bystander, pub = await connect(herald), await connect(herald)
    await subscribe(bystander, "close/utf8", id=1)
    bad = await connect(herald)
    await asyncio.wait_for(bad.send(b'{"op":"ping","id":1,"x":"\xff\xfe"}', text=True), STEP)
    code, reason = await expect_close(bad)
    assert code == 1007
    assert reason.startswith("invalid UTF-8"), reason

    await assert_alive(bystander)
    await publish(pub, "close/utf8", "still here", id=1)
    assert (await recv_msg(bystander))["data"] == "still here"
    await bystander.close()
    await pub.close()


@pytest.fixture(scope="module")
def small_herald():
    """A second server whose payload limit is 1000 bytes."""
    server = Herald("--max-message-bytes", "1000")
    yield server
    server.stop_and_check()


@run_async
async def test_payload_over_the_limit_is_message_too_large(small_herald):
    ws = await connect(small_herald)
    await send_json(ws, {"op": "pub", "id": 1, "topic": "limit/t", "data": "x" * 2000})
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == "message_too_large" and err["id"] == 1, err
    await asyncio.wait_for(ws.send(encode_binary({"op": "pub", "id": 2, "topic": "limit/t"}, b"\0" * 2000)), STEP)
    err = await recv_json(ws)
    assert err["op"] == "error" and err["code"] == "message_too_large" and err["id"] == 2, err
    await assert_alive(ws)
    await publish(ws, "limit/t", "small", id=3)  # the rejected ones took no sequence number
    await ws.close()


@run_async
async def test_frame_over_the_limit_closes_with_1009(small_herald):
    bystander, pub = await connect(small_herald), await connect(small_herald)
    await subscribe(bystander, "close/big", id=1)
    await publish(pub, "close/big", "x" * 900, id=1)  # under the limit: fine
    assert len((await recv_msg(bystander))["data"]) == 900

    big = await connect(small_herald)
    frame = encode_binary({"op": "pub", "topic": "close/big"}, b"\x00" * (200 * 1024))
    await asyncio.wait_for(big.send(frame), STEP)
    code, reason = await expect_close(big)
    assert code == 1009
    assert reason.startswith("frame too large"), reason

    await assert_alive(bystander)
    await publish(pub, "close/big", "after", id=2)
    assert (await recv_msg(bystander))["data"] == "after"
    await bystander.close()
    await pub.close()


def raw_upgrade(server: Herald) -> socket.socket:
    """A plain TCP socket that has completed the WebSocket handshake on /ws."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=STEP)
    try:
        return _handshake(sock, server)
    except BaseException:
        sock.close()
        raise


def _handshake(sock: socket.socket, server: Herald) -> socket.socket:
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            "GET /ws HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed during the handshake: {response!r}"
        response += chunk
    head, _, rest = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    accept = base64.b64encode(
        hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    )
    assert b"sec-websocket-accept: " + accept.lower() in head.lower(), head
    assert rest == b""
    return sock


def raw_read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """Read one (unfragmented) server frame; return (opcode, payload)."""
    buf = b""

    def need(n):
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))  # never read past this frame
            assert chunk, "connection ended without a close frame"
            buf += chunk

    while True:
        need(2)
        opcode, length = buf[0] & 0x0F, buf[1] & 0x7F
        assert not buf[1] & 0x80, "server frames must not be masked"
        offset = 2
        if length == 126:
            need(4)
            (length,) = struct.unpack(">H", buf[2:4])
            offset = 4
        elif length == 127:
            need(10)
            (length,) = struct.unpack(">Q", buf[2:10])
            offset = 10
        need(offset + length)
        return opcode, buf[offset:]


def raw_read_close(sock: socket.socket) -> tuple[int, str]:
    """Read server frames until a close frame; return its (code, reason)."""
    while True:
        opcode, payload = raw_read_frame(sock)
        if opcode == 0x8:
            (code,) = struct.unpack(">H", payload[:2])
            return code, payload[2:].decode()


def raw_send(sock: socket.socket, opcode: int, body: bytes, masked: bool = True) -> None:
    """Write one final frame (payload under 126 bytes), masked as a client must unless told not to."""
    assert len(body) < 126
    if not masked:
        sock.sendall(bytes([0x80 | opcode, len(body)]) + body)
        return
    mask = os.urandom(4)
    sock.sendall(bytes([0x80 | opcode, 0x80 | len(body)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(body)))


def test_raw_socket_helper_speaks_websocket(herald):
    """Baseline for the raw-socket helpers used by the 1002 test."""
    sock = raw_upgrade(herald)
    try:
        raw_send(sock, 0x1, b'{"op":"ping","id":"raw"}')
        assert raw_read_frame(sock) == (0x1, b'{"op":"pong","id":"raw"}')
        raw_send(sock, 0x8, struct.pack(">H", 1000))
        assert raw_read_close(sock)[0] == 1000
    finally:
        sock.close()


@run_async
async def test_unmasked_client_frame_closes_with_1002(herald):
    bystander = await connect(herald)
    try:
        sock = await asyncio.to_thread(raw_upgrade, herald)
        try:
            raw_send(sock, 0x1, b'{"op":"ping","id":1}', masked=False)
            code, reason = await asyncio.to_thread(raw_read_close, sock)
        finally:
            sock.close()
        assert code == 1002
        assert reason.startswith("protocol error"), reason
        await assert_alive(bystander)
    finally:
        await bystander.close()


# --------------------------------------------------------------------------------------------
# 11. Graceful shutdown
# --------------------------------------------------------------------------------------------


@run_async
async def test_sigterm_closes_clients_with_1001_and_exits_0():
    server = Herald()
    try:
        clients = [await connect(server) for _ in range(3)]
        await subscribe(clients[0], "bye/*", id=1)
        for ws in clients:
            await assert_alive(ws)
        server.proc.send_signal(signal.SIGTERM)
        for ws in clients:
            code, reason = await expect_close(ws)
            assert code == 1001
            assert reason.startswith("server shutting down"), reason
        code = await asyncio.to_thread(server.terminate)
        assert code == 0, server.output()
    finally:
        server.close()
