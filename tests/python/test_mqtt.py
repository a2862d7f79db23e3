"""MQTT 3.1.1 and 5.0 against herald (docs/mqtt.md), with real clients over real sockets:
Eclipse Paho (TCP and WebSocket transports), Debian's mosquitto_pub / mosquitto_sub, and
herald's native WebSocket and HTTP clients on the same topics. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import shutil
import socket
import subprocess
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from test_protocol import (
    STEP,
    Herald,
    connect,
    decode_binary,
    free_port,
    http_post,
    recv_binary,
    recv_msg,
    run_async,
    send_json,
    subscribe,
)

VERSIONS = {"3.1.1": mqtt.MQTTv311, "5.0": mqtt.MQTTv5}
TRANSPORTS = ["tcp", "websockets"]


@pytest.fixture(scope="module")
def herald():
    mqtt_port = free_port()
    server = Herald("--mqtt-listen", f"127.0.0.1:{mqtt_port}")
    server.mqtt_port = mqtt_port
    yield server
    server.stop_and_check()


class Client:
    """A Paho client whose received messages land in a queue. `session`: seconds its session
    outlives the connection (5.0 session expiry; 3.1.1: clean session 0), none by default;
    `will`: Paho's `will_set` arguments, with 5.0 `will_properties` and `will_delay`."""

    def __init__(
        self,
        server: Herald,
        version: str = "5.0",
        transport: str = "tcp",
        will=None,
        client_id: str | None = None,
        session: int = 0,
        clean: bool = True,
        will_delay: int = 0,
        will_properties: Properties | None = None,
        receive_maximum: int | None = None,
        manual_ack: bool = False,
    ):
        self.version = VERSIONS[version]
        v5 = self.version == mqtt.MQTTv5
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id or f"t-{uuid.uuid4().hex[:8]}",
            protocol=self.version,
            transport=transport,
            manual_ack=manual_ack,
            **({} if v5 else {"clean_session": clean and not session}),
        )
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
            port = server.port
        else:
            port = server.mqtt_port
        if will:
            props = will_properties
            if will_delay:
                props = props or Properties(PacketTypes.WILLMESSAGE)
                props.WillDelayInterval = will_delay
            self.c.will_set(*will, properties=props)
        self.messages: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.connacks: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put(codes)
        self.c.on_connect = lambda c, u, flags, reason, props: self.connacks.put((reason, flags, props))
        self.c.on_disconnect = lambda c, u, flags, reason, props: self.disconnects.put(reason)
        kwargs = {}
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if session:
                props.SessionExpiryInterval = session
            if receive_maximum:
                props.ReceiveMaximum = receive_maximum
            kwargs = {"clean_start": clean, "properties": props}
        self.c.connect("127.0.0.1", port, keepalive=30, **kwargs)
        self.c.loop_start()
        reason, flags, self.connack = self.connacks.get(timeout=STEP)
        assert not reason.is_failure, reason
        self.session_present = flags.session_present

    def subscribe(self, topic: str, qos: int = 0, sid: int | None = None, **options):
        if self.version == mqtt.MQTTv5:
            opts = mqtt.SubscribeOptions(qos=qos, **options)
            props = None
            if sid is not None:
                props = Properties(PacketTypes.SUBSCRIBE)
                props.SubscriptionIdentifier = sid
            self.c.subscribe(topic, options=opts, properties=props)
        else:
            self.c.subscribe(topic, qos)
        return self.subacks.get(timeout=STEP)

    def unsubscribe(self, topic: str):
        done = queue.Queue()
        self.c.on_unsubscribe = lambda c, u, mid, codes, props: done.put(codes)
        self.c.unsubscribe(topic)
        return done.get(timeout=STEP)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, properties=None):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(timeout=STEP)
        assert info.is_published()

    def message(self):
        return self.messages.get(timeout=STEP)

    def nothing(self, wait: float = 0.3):
        with pytest.raises(queue.Empty):
            self.messages.get(timeout=wait)

    def close(self, **disconnect):
        self.c.disconnect(**disconnect)
        self.c.loop_stop()

    def drop(self):
        """Ends the connection without DISCONNECT."""
        self.c.loop_stop()
        self.c.socket().close()


def granted(codes) -> list[int]:
    return [c.value if hasattr(c, "value") else c for c in codes]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_binary_payloads_arrive_in_order_exactly_once_at_qos1(herald, version, transport):
    topic = f"paho/{transport}/{version}"
    sub = Client(herald, version, transport)
    assert granted(sub.subscribe(f"{topic}/#", qos=1)) == [1]
    pub = Client(herald, version, transport)
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(200)]
    for i, payload in enumerate(payloads):
        pub.publish(f"{topic}/x", payload, qos=1)
    got = [sub.message() for _ in payloads]
    assert [m.payload for m in got] == payloads
    assert all(m.topic == f"{topic}/x" and m.qos == 1 and not m.retain for m in got)
    sub.nothing()
    sub.close()
    pub.close()


def test_qos2_publish_is_delivered_once_and_granted_as_qos1(herald):
    sub = Client(herald, "3.1.1")
    assert granted(sub.subscribe("q2/t", qos=2)) == [1]
    pub = Client(herald, "5.0")
    pub.publish("q2/t", b"once", qos=2)
    m = sub.message()
    assert (m.payload, m.qos) == (b"once", 1)
    sub.nothing()
    sub.close()
    pub.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_message_is_sent_at_the_lower_of_its_qos_and_the_grant(herald, version):
    """§3.8.4: a QoS 1 subscriber gets a QoS 0 publish at QoS 0 (and QoS 2 at the QoS 1 it
    was granted); a message from a native publisher, which has no QoS, comes at QoS 1."""
    topic = f"minq/{version}"
    sub = Client(herald, version)
    assert granted(sub.subscribe(topic, qos=1)) == [1]
    pub = Client(herald, version)
    for qos in (0, 1, 2, 0):
        pub.publish(topic, f"q{qos}".encode(), qos=qos)
    r = http_post(herald, f"/api/publish/{topic}", b"native", "application/octet-stream")
    assert r.status_code == 200, r.text
    got = [(m.payload, m.qos) for m in (sub.message() for _ in range(5))]
    assert got == [(b"q0", 0), (b"q1", 1), (b"q2", 1), (b"q0", 0), (b"native", 1)]
    sub.nothing()
    sub.close()
    pub.close()


def test_parent_level_and_dollar_topics(herald):
    sub = Client(herald)
    sub.subscribe("lvl/#")
    wild = Client(herald)
    wild.subscribe("#")
    pub = Client(herald)
    pub.publish("lvl", b"parent")
    assert sub.message().payload == b"parent"
    pub.publish("$lvl/x", b"dollar")
    pub.publish("lvl/a/b", b"child")
    assert sub.message().payload == b"child"
    got = [wild.message().payload for _ in range(2)]
    assert got == [b"parent", b"child"], "a leading wildcard does not match $ topics"
    for c in (sub, wild, pub):
        c.close()


def test_retained_messages(herald):
    pub = Client(herald, "5.0")
    pub.publish("ret/a", b"keep-a", qos=1, retain=True)
    pub.publish("ret/b", b"keep-b", qos=0, retain=True)
    pub.publish("ret/b", b"live-not-retained", qos=1)
    time.sleep(0.2)  # the QoS 0 retained publish has no acknowledgement
    sub = Client(herald, "3.1.1")
    sub.subscribe("ret/+", qos=1)
    got = {}
    for _ in range(2):
        m = sub.message()
        got[m.topic] = (m.payload, m.retain)
    assert got == {"ret/a": (b"keep-a", True), "ret/b": (b"keep-b", True)}
    sub.nothing()
    # retain handling 2: never sent on subscribe.
    never = Client(herald, "5.0")
    never.subscribe("ret/#", qos=1, retainHandling=2)
    never.nothing()
    # An empty retained payload clears it.
    pub.publish("ret/a", b"", qos=1, retain=True)
    assert sub.message().payload == b""
    late = Client(herald, "5.0")
    late.subscribe("ret/a")
    late.nothing()
    for c in (pub, sub, never, late):
        c.close()


def test_will_is_published_on_abrupt_close_not_on_disconnect(herald):
    sub = Client(herald, "3.1.1")
    sub.subscribe("will/#", qos=1)
    clean = Client(herald, "5.0", will=("will/clean", b"bye", 1, False))
    clean.close()
    sub.nothing()
    dying = Client(herald, "3.1.1", will=("will/dead", b"gone", 1, False))
    dying.c.loop_stop()
    dying.c.socket().close()
    m = sub.message()
    assert (m.topic, m.payload) == ("will/dead", b"gone")
    sub.close()


@run_async
async def test_mqtt_to_native_websocket(herald):
    ws = await connect(herald)
    await subscribe(ws, "cross/m2n", id=1)
    pub = await asyncio.to_thread(Client, herald, "3.1.1")
    payloads = [bytes([i]) * i + b"\x00\xff" for i in range(50)]
    for p in payloads:
        await asyncio.to_thread(pub.publish, "cross/m2n", p, 1)
    for i, p in enumerate(payloads):
        head, body = await recv_binary(ws)
        assert (head["topic"], head["seq"], body) == ("cross/m2n", i + 1, p)
    await asyncio.to_thread(pub.close)
    await ws.close()


@run_async
async def test_native_websocket_and_http_to_mqtt(herald):
    sub = await asyncio.to_thread(Client, herald, "5.0", "websockets")
    await asyncio.to_thread(sub.subscribe, "cross/n2m/#", 1)
    ws = await connect(herald)
    await send_json(ws, {"op": "pub", "topic": "cross/n2m/ws", "data": "héllo", "ct": "text/plain"})
    m = await asyncio.to_thread(sub.message)
    assert (m.topic, m.payload) == ("cross/n2m/ws", "héllo".encode())
    assert m.properties.ContentType == "text/plain"
    assert m.properties.PayloadFormatIndicator == 1
    payload = random.Random(3).randbytes(70_000)
    r = await asyncio.to_thread(http_post, herald, "/api/publish/cross/n2m/http", payload, "application/octet-stream")
    assert r.status_code == 200, r.text
    m = await asyncio.to_thread(sub.message)
    assert (m.topic, m.payload) == ("cross/n2m/http", payload)
    await asyncio.to_thread(sub.nothing)
    await asyncio.to_thread(sub.close)
    await ws.close()


def test_shared_subscription_gives_each_message_to_one_member_in_turn(herald):
    pub = Client(herald, "5.0")
    pub.publish("sh/r", b"retained", qos=1, retain=True)
    members = [Client(herald, "5.0"), Client(herald, "5.0", "websockets"), Client(herald, "3.1.1")]
    assert members[0].connack.SharedSubscriptionAvailable == 1
    for m in members:
        assert granted(m.subscribe("$share/grp/sh/#", qos=1)) == [1]
    own = Client(herald, "5.0")
    own.subscribe("sh/#", qos=1)
    assert own.message().payload == b"retained"
    for m in members:
        m.nothing(0.1)  # a shared subscription is not sent retained messages
    payloads = [f"m{i}".encode() for i in range(30)]
    for p in payloads:
        pub.publish("sh/x", p, qos=1)
    got = [[m.message().payload for _ in range(10)] for m in members]
    for k, g in enumerate(got):
        assert g == payloads[k::3], f"member {k} takes every third message, in order"
    assert [own.message().payload for _ in payloads] == payloads, "a plain subscription gets all"
    for m in members:
        m.nothing(0.1)
    # A member that leaves no longer takes turns.
    members[2].unsubscribe("$share/grp/sh/#")
    for p in payloads[:4]:
        pub.publish("sh/y", p, qos=1)
    assert [members[0].message().payload for _ in range(2)] == payloads[0:4:2]
    assert [members[1].message().payload for _ in range(2)] == payloads[1:4:2]
    members[2].nothing(0.1)
    for c in (*members, own, pub):
        c.close()


def test_no_local_on_a_shared_subscription_is_a_protocol_error(herald):
    c = Client(herald, "5.0")
    c.c.subscribe("$share/g/t", options=mqtt.SubscribeOptions(qos=0, noLocal=True))
    assert c.disconnects.get(timeout=STEP).value == 0x82
    c.c.loop_stop()


def test_no_local_keeps_a_clients_own_messages_from_it(herald):
    a = Client(herald, "5.0")
    b = Client(herald, "5.0")
    a.subscribe("nl/#", qos=1, noLocal=True)
    b.subscribe("nl/#", qos=1, noLocal=True)
    a.publish("nl/t", b"from-a", qos=1)
    assert b.message().payload == b"from-a"
    b.publish("nl/t", b"from-b", qos=1)
    assert a.message().payload == b"from-b"
    a.nothing()
    b.nothing(0.1)
    a.close()
    b.close()


def test_retain_as_published_and_retain_handling(herald):
    pub = Client(herald, "5.0")
    pub.publish("rh/kept", b"kept", qos=1, retain=True)
    rap = Client(herald, "5.0")
    plain = Client(herald, "5.0")
    rap.subscribe("rh/#", qos=1, retainAsPublished=True)
    plain.subscribe("rh/#", qos=1)
    # Sent on subscribe, a retained message has the flag whatever the option.
    assert [(m.payload, m.retain) for m in (rap.message(), plain.message())] == [(b"kept", True)] * 2
    pub.publish("rh/live", b"r", qos=1, retain=True)
    pub.publish("rh/live", b"n", qos=1)
    assert [(m.payload, m.retain) for m in (rap.message(), rap.message())] == [(b"r", True), (b"n", False)]
    assert [(m.payload, m.retain) for m in (plain.message(), plain.message())] == [(b"r", False), (b"n", False)]
    # Retain handling 0: again at every subscribe; 1: only when the subscription is new.
    for handling, again in [(0, True), (1, False)]:
        c = Client(herald, "5.0")
        c.subscribe("rh/kept", qos=1, retainHandling=handling)
        assert c.message().payload == b"kept"
        c.subscribe("rh/kept", qos=1, retainHandling=handling)
        if again:
            assert c.message().payload == b"kept"
        else:
            c.nothing()
        c.close()
    for c in (pub, rap, plain):
        c.close()


def test_subscription_identifiers_name_every_matching_subscription(herald):
    c = Client(herald, "5.0")
    assert c.connack.SubscriptionIdentifierAvailable == 1
    c.subscribe("sid/#", sid=5)
    c.subscribe("sid/x", qos=1, sid=268_435_455)
    c.subscribe("$share/s/sid/x", sid=9)
    pub = Client(herald, "5.0")
    pub.publish("sid/x", b"both", qos=1)
    pub.publish("sid/y", b"one", qos=1)
    got = {}
    for _ in range(3):
        m = c.message()
        got.setdefault(m.payload, []).append(sorted(m.properties.SubscriptionIdentifier))
    assert sorted(got[b"both"]) == [[5, 268_435_455], [9]], "its own, and the shared one"
    assert got[b"one"] == [[5]]
    c.close()
    pub.close()


@run_async
async def test_properties_and_expiry_reach_subscribers_unchanged(herald):
    v5 = await asyncio.to_thread(Client, herald, "5.0", "websockets")
    v3 = await asyncio.to_thread(Client, herald, "3.1.1")
    for c in (v5, v3):
        await asyncio.to_thread(c.subscribe, "props/#", 1)
    ws = await connect(herald)
    await subscribe(ws, "props/>", id=1)
    pub = await asyncio.to_thread(Client, herald, "5.0")
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("b", "1"), ("a", "2"), ("b", "3")]
    props.ResponseTopic = "props/reply"
    props.CorrelationData = b"\x00\x01req"
    props.PayloadFormatIndicator = 1
    props.ContentType = "text/plain"
    props.MessageExpiryInterval = 60
    await asyncio.to_thread(pub.publish, "props/t", "héllo".encode(), 1, False, props)
    m = await asyncio.to_thread(v5.message)
    assert m.payload == "héllo".encode()
    got = m.properties
    assert got.UserProperty == [("b", "1"), ("a", "2"), ("b", "3")]
    assert (got.ResponseTopic, got.CorrelationData) == ("props/reply", b"\x00\x01req")
    assert (got.PayloadFormatIndicator, got.ContentType) == (1, "text/plain")
    assert got.MessageExpiryInterval in (59, 60)
    assert (await asyncio.to_thread(v3.message)).payload == "héllo".encode()
    frame = await recv_msg(ws)
    assert (frame["topic"], frame["data"], frame["ct"]) == ("props/t", "héllo", "text/plain")
    await ws.close()
    # Retained: the interval counts down while it waits, and an expired one is not sent.
    for topic, secs in [("props/short", 1), ("props/long", 3)]:
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = secs
        await asyncio.to_thread(pub.publish, topic, b"x", 1, True, props)
    await asyncio.sleep(1.2)
    late = await asyncio.to_thread(Client, herald, "5.0")
    await asyncio.to_thread(late.subscribe, "props/#", 1)
    m = await asyncio.to_thread(late.message)
    assert (m.topic, m.properties.MessageExpiryInterval) == ("props/long", 2)
    await asyncio.to_thread(late.nothing)
    for c in (v5, v3, pub, late):
        await asyncio.to_thread(c.close)


def test_enhanced_authentication_is_refused(herald):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    reasons: queue.Queue = queue.Queue()
    c.on_connect = lambda c, u, flags, reason, props: reasons.put(reason)
    props = Properties(PacketTypes.CONNECT)
    props.AuthenticationMethod = "SCRAM-SHA-256"
    c.connect("127.0.0.1", herald.mqtt_port, properties=props)
    c.loop_start()
    assert reasons.get(timeout=STEP).value == 0x8C
    c.loop_stop()


def raw_connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=STEP)
    body = b"\x00\x04MQTT\x04\x02\x00\x1e\x00\x01r"
    s.sendall(bytes([0x10, len(body)]) + body)
    assert s.recv(4) == b"\x20\x02\x00\x00"
    return s


def closed(s: socket.socket) -> bool:
    try:
        while s.recv(4096):
            pass
        return True
    except (ConnectionResetError, socket.timeout):
        return False


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"\xc0\x00", id="pingreq-before-connect"),
        pytest.param(None, id="bad-remaining-length"),
        pytest.param(None, id="oversized"),
        pytest.param(None, id="wildcard-in-topic-name"),
    ],
)
def test_bad_input_closes_that_connection_only(herald, bad, request):
    watcher = Client(herald, "3.1.1")
    watcher.subscribe("still/ok")
    case = request.node.callspec.id
    if case == "pingreq-before-connect":
        s = socket.create_connection(("127.0.0.1", herald.mqtt_port), timeout=STEP)
        s.sendall(bad)
    else:
        s = raw_connect(herald.mqtt_port)
        if case == "bad-remaining-length":
            s.sendall(b"\x30\xff\xff\xff\xff\x01")
        elif case == "oversized":
            # A remaining length of 200 MiB: over max_message_bytes + 64 KiB.
            s.sendall(b"\x30\x80\x80\x80\x64")
        else:
            s.sendall(b"\x30\x05\x00\x03a/#")
    assert closed(s)
    s.close()
    pub = Client(herald, "5.0")
    pub.publish("still/ok", b"fine")
    assert watcher.message().payload == b"fine"
    pub.close()
    watcher.close()


def mqtt_string(text: str) -> bytes:
    return len(text.encode()).to_bytes(2, "big") + text.encode()


def mqtt_packet(first: int, body: bytes) -> bytes:
    """A packet with a remaining length of one byte (under 128)."""
    assert len(body) < 128
    return bytes([first, len(body)]) + body


@pytest.mark.parametrize("level", [4, 5])
def test_publishes_sent_with_the_disconnect_after_them_all_count(herald, level):
    """CONNECT, retained PUBLISHes and DISCONNECT in one write, as a client that publishes and
    disconnects at once sends them: herald reads them together and carries out every PUBLISH
    before it closes."""
    props = b"\x00" if level == 5 else b""
    connect = mqtt_packet(
        0x10, mqtt_string("MQTT") + bytes([level, 0x02, 0x00, 0x1E]) + props + mqtt_string("")
    )
    topics = [f"burst{level}/{i}" for i in range(5)]
    publishes = b"".join(mqtt_packet(0x31, mqtt_string(t) + props + t.encode()) for t in topics)
    disconnect = b"\xe0\x00"
    s = socket.create_connection(("127.0.0.1", herald.mqtt_port), timeout=STEP)
    s.sendall(connect + publishes + disconnect)
    assert closed(s)
    s.close()
    sub = Client(herald, "3.1.1")
    sub.subscribe(f"burst{level}/+")
    got = sorted((m.topic, m.payload, m.retain) for m in [sub.message() for _ in topics])
    assert got == [(t, t.encode(), True) for t in topics]
    sub.close()


def test_websocket_subprotocol_is_echoed(herald):
    import base64
    import os

    key = base64.b64encode(os.urandom(16)).decode()
    for offered, chosen in [("mqtt", "mqtt"), ("mqttv3.1", "mqttv3.1")]:
        s = socket.create_connection(("127.0.0.1", herald.port), timeout=STEP)
        s.sendall(
            (
                "GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {offered}\r\n\r\n"
            ).encode()
        )
        head = s.recv(4096).decode().lower()
        assert head.startswith("http/1.1 101")
        assert f"sec-websocket-protocol: {chosen}" in head
        s.close()


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed")
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_clients(herald, version):
    port = str(herald.mqtt_port)
    topic = f"mosq/{version}"
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-V", version, "-t", f"{topic}/#", "-q", "1", "-C", "3", "-v"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)
    for i in range(3):
        subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-V", version, "-t", f"{topic}/t", "-m", f"m{i}", "-q", "1"],
            check=True,
            timeout=STEP,
        )
    out, err = sub.communicate(timeout=STEP)
    assert sub.returncode == 0, err
    assert out.decode().splitlines() == [f"{topic}/t m{i}" for i in range(3)]


# --------------------------------------------------------------------------------------------
# Sessions (docs/mqtt.md, "Sessions")
# --------------------------------------------------------------------------------------------


def away(version: str) -> dict:
    """The options of a client whose session outlives its connection, in its version."""
    return {"session": 60, "clean": False}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_session_keeps_its_subscriptions_and_messages_while_the_client_is_away(herald, version):
    topic = f"away/{version}"
    cid = f"keep-{uuid.uuid4().hex[:8]}"
    sub = Client(herald, version, client_id=cid, **away(version))
    assert not sub.session_present
    assert granted(sub.subscribe(f"{topic}/#", qos=1)) == [1]
    sub.close()
    pub = Client(herald, "5.0")
    for i in range(3):
        pub.publish(f"{topic}/a", f"m{i}".encode(), qos=1)
    back = Client(herald, version, client_id=cid, **away(version))
    assert back.session_present
    got = [back.message() for _ in range(3)]
    assert [(m.topic, m.payload, m.qos) for m in got] == [(f"{topic}/a", f"m{i}".encode(), 1) for i in range(3)]
    # Subscribed still, with no new SUBSCRIBE.
    pub.publish(f"{topic}/b", b"live", qos=0)
    assert back.message().payload == b"live"
    back.nothing()
    # A clean start discards the session.
    back.close()
    fresh = Client(herald, version, client_id=cid)
    assert not fresh.session_present
    pub.publish(f"{topic}/a", b"gone")
    fresh.nothing()
    for c in (fresh, pub):
        c.close()


def metric(server: Herald, name: str) -> float:
    import requests

    text = requests.get(f"{server.http}/metrics", timeout=STEP).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_session_expires_by_its_timer_and_disconnect_may_extend_it(herald):
    cid = f"exp-{uuid.uuid4().hex[:8]}"
    before = metric(herald, "herald_subscriptions")
    c = Client(herald, "5.0", client_id=cid, session=1, clean=False)
    c.subscribe("exp/t", qos=1)
    c.close()
    time.sleep(0.2)
    assert metric(herald, "herald_subscriptions") == before + 1, "kept while the client is away"
    deadline = time.monotonic() + STEP
    while metric(herald, "herald_subscriptions") != before:
        assert time.monotonic() < deadline, "the session's subscription outlived its expiry"
        time.sleep(0.1)
    late = Client(herald, "5.0", client_id=cid, session=1, clean=False)
    assert not late.session_present
    # DISCONNECT's session expiry replaces the CONNECT's.
    late.subscribe("exp/t", qos=1)
    props = Properties(PacketTypes.DISCONNECT)
    props.SessionExpiryInterval = 30
    late.close(properties=props)
    time.sleep(1.5)
    again = Client(herald, "5.0", client_id=cid, session=1, clean=False)
    assert again.session_present
    again.close()


def test_a_session_expiry_past_the_maximum_is_cut_to_it(herald):
    c = Client(herald, "5.0", session=0xFFFFFFFF)
    assert c.connack.SessionExpiryInterval == 86400
    c.close()


def test_a_second_connection_with_the_same_identifier_takes_the_session_over(herald):
    cid = f"dup-{uuid.uuid4().hex[:8]}"
    first = Client(herald, "5.0", client_id=cid, session=60)
    first.subscribe("over/#", qos=1)
    second = Client(herald, "5.0", client_id=cid, session=60, clean=False)
    assert second.session_present
    assert first.disconnects.get(timeout=STEP).value == 0x8E
    first.c.loop_stop()  # Paho would connect again, and take the session back
    pub = Client(herald, "3.1.1")
    pub.publish("over/x", b"to-the-second", qos=1)
    assert second.message().payload == b"to-the-second"
    first.nothing()
    for c in (second, pub):
        c.close()


def test_client_identifier_rules(herald):
    # 3.1.1: an empty identifier only with a clean session (else CONNACK 0x02).
    s = socket.create_connection(("127.0.0.1", herald.mqtt_port), timeout=STEP)
    body = b"\x00\x04MQTT\x04\x00\x00\x1e\x00\x00"
    s.sendall(bytes([0x10, len(body)]) + body)
    assert s.recv(4) == b"\x20\x02\x00\x02"
    assert closed(s)
    s.close()
    # 5.0: herald assigns one.
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv5)
    props: queue.Queue = queue.Queue()
    c.on_connect = lambda c, u, flags, reason, p: props.put(p)
    c.connect("127.0.0.1", herald.mqtt_port, clean_start=True)
    c.loop_start()
    assigned = props.get(timeout=STEP).AssignedClientIdentifier
    assert assigned.startswith("herald-")
    c.disconnect()
    c.loop_stop()


def mqtt_packets(s: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """The next `n` packets the server sends on `s`: first byte, and what follows the length."""

    def exactly(k: int) -> bytes:
        data = b""
        while len(data) < k:
            chunk = s.recv(k - len(data))
            assert chunk, "the connection ended"
            data += chunk
        return data

    packets = []
    for _ in range(n):
        first, length, shift = exactly(1)[0], 0, 0
        while True:
            byte = exactly(1)[0]
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        packets.append((first, exactly(length)))
    return packets


def test_unacknowledged_messages_are_sent_again_with_dup_in_order(herald):
    def connect(cid: bytes) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", herald.mqtt_port), timeout=STEP)
        body = b"\x00\x04MQTT\x04\x00\x00\x1e" + len(cid).to_bytes(2, "big") + cid
        s.sendall(bytes([0x10, len(body)]) + body)
        return s

    cid = f"dup-{uuid.uuid4().hex[:8]}".encode()
    s = connect(cid)
    assert mqtt_packets(s, 1) == [(0x20, b"\x00\x00")]
    s.sendall(b"\x82\x08\x00\x01\x00\x03d/t\x01")
    assert mqtt_packets(s, 1) == [(0x90, b"\x00\x01\x01")]
    pub = Client(herald, "3.1.1")
    for p in (b"x", b"y"):
        pub.publish("d/t", p, qos=1)
    first = mqtt_packets(s, 2)
    assert [f for f, _ in first] == [0x32, 0x32]
    s.close()  # without acknowledging
    s = connect(cid)
    assert mqtt_packets(s, 1) == [(0x20, b"\x01\x00")], "session present"
    again = mqtt_packets(s, 2)
    assert again == [(0x3A, body) for _, body in first], "the same packets, DUP set, in order"
    s.close()
    pub.close()


def test_will_delay_and_disconnect_with_will(herald):
    sub = Client(herald, "5.0")
    sub.subscribe("wd/#", qos=1)
    # Published once the delay passes, not before.
    dying = Client(herald, "5.0", will=("wd/late", b"late", 1, False), will_delay=1, session=10)
    dying.drop()
    sub.nothing(0.6)
    assert sub.message().topic == "wd/late"
    # Not published at all when the client comes back within the delay.
    cid = f"wd-{uuid.uuid4().hex[:8]}"
    back = Client(herald, "5.0", client_id=cid, will=("wd/back", b"x", 1, False), will_delay=2, session=10)
    back.drop()
    time.sleep(0.3)
    returned = Client(herald, "5.0", client_id=cid, session=10, clean=False)
    assert returned.session_present
    sub.nothing(2.2)
    returned.close()
    # DISCONNECT 0x04 asks for the will.
    asked = Client(herald, "5.0", will=("wd/asked", b"asked", 1, False))
    from paho.mqtt.reasoncodes import ReasonCode

    asked.close(reasoncode=ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"))
    assert sub.message().topic == "wd/asked"
    sub.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_messages_lost_while_away_are_announced_on_the_next_one(herald, version):
    topic = f"gap/{version}"
    cid = f"gap-{uuid.uuid4().hex[:8]}"
    sub = Client(herald, version, client_id=cid, **away(version))
    sub.subscribe(topic, qos=1)
    sub.close()
    pub = Client(herald, "5.0")
    for i in range(1003):
        pub.c.publish(topic, str(i).encode(), qos=0)
    pub.publish(topic, b"1003", qos=1)  # after the others, acknowledged once all are in
    back = Client(herald, version, client_id=cid, **away(version))
    got = [back.message() for _ in range(1000)]
    # The session keeps the newest 1,000 (mqtt_session_queue_messages).
    assert [int(m.payload) for m in got] == list(range(4, 1004))
    if version == "5.0":
        assert got[0].properties.UserProperty == [("herald-gap", "4")]
        assert not hasattr(got[1].properties, "UserProperty")
    back.nothing()
    for c in (back, pub):
        c.close()


def test_the_receive_maximum_bounds_the_connection_not_each_subscription(herald):
    sub = Client(herald, "5.0", receive_maximum=2, manual_ack=True)
    for t in ("rm/1", "rm/2"):
        assert granted(sub.subscribe(t, qos=1)) == [1]
    pub = Client(herald, "5.0")
    for t, p in (("rm/1", b"a"), ("rm/2", b"b"), ("rm/1", b"c"), ("rm/2", b"d")):
        pub.publish(t, p, qos=1)  # accepted: herald keeps what the client has no room for
    first, second = sub.message(), sub.message()
    assert (first.payload, second.payload) == (b"a", b"b")
    sub.nothing()
    sub.c.ack(first.mid, first.qos)
    assert sub.message().payload == b"c"
    sub.nothing()
    sub.c.ack(second.mid, second.qos)
    assert sub.message().payload == b"d"
    for c in (sub, pub):
        c.close()


def test_more_qos2_messages_awaiting_release_than_the_receive_maximum_disconnect(herald):
    s = socket.create_connection(("127.0.0.1", herald.mqtt_port), timeout=STEP)
    body = b"\x00\x04MQTT\x05\x02\x00\x1e\x00\x00\x02rm"
    s.sendall(bytes([0x10, len(body)]) + body)
    connack = s.recv(64)
    assert connack[:4] == b"\x20" + bytes([connack[1]]) + b"\x00\x00"
    assert b"\x21\x04\x00" in connack, "receive maximum 1024 announced"
    # QoS 2 PUBLISH packets whose PUBREL never comes: the 1,025th is one too many.
    publish = [bytes([0x34, 7, 0, 2]) + b"q2" + i.to_bytes(2, "big") + b"\x00" for i in range(1, 1026)]
    s.sendall(b"".join(publish[:1024]))
    assert [first for first, _ in mqtt_packets(s, 1024)] == [0x50] * 1024, "a PUBREC each"
    s.sendall(publish[1024])
    [(first, body)] = mqtt_packets(s, 1)
    assert (first, body[0]) == (0xE0, 0x93), "DISCONNECT, receive maximum exceeded"
    assert closed(s)
    s.close()


def test_a_delayed_will_keeps_its_properties_and_retain(herald):
    sub = Client(herald, "5.0")
    sub.subscribe("wp/#", qos=1, retainAsPublished=True)
    props = Properties(PacketTypes.WILLMESSAGE)
    props.UserProperty = [("why", "gone")]
    props.ContentType = "text/plain"
    props.MessageExpiryInterval = 30
    will = ("wp/t", b"bye", 1, True)
    dying = Client(herald, "5.0", will=will, will_properties=props, will_delay=2, session=10)
    dying.drop()
    sub.nothing(1.5)
    m = sub.message()
    assert (m.topic, m.payload, m.retain) == ("wp/t", b"bye", True)
    assert (m.properties.UserProperty, m.properties.ContentType) == ([("why", "gone")], "text/plain")
    assert m.properties.MessageExpiryInterval in (29, 30), "counted from when it is published"
    late = Client(herald, "5.0")
    late.subscribe("wp/#", qos=1)
    kept = late.message()
    assert (kept.payload, kept.retain, kept.properties.UserProperty) == (b"bye", True, [("why", "gone")])
    late.publish("wp/t", b"", qos=1, retain=True)  # clears the retained will
    for c in (sub, late):
        c.close()


def test_a_kept_session_leaves_its_shared_subscription_while_away(herald):
    cid = f"ks-{uuid.uuid4().hex[:8]}"
    member = Client(herald, "5.0", client_id=cid, session=60)
    assert granted(member.subscribe("$share/ks/ks/#", qos=1)) == [1]
    other = Client(herald, "3.1.1")
    assert granted(other.subscribe("$share/ks/ks/#", qos=1)) == [1]
    member.close()
    pub = Client(herald, "5.0")
    first = [f"a{i}".encode() for i in range(4)]
    for p in first:
        pub.publish("ks/t", p, qos=1)
    assert [other.message().payload for _ in first] == first, "all to the member still there"
    back = Client(herald, "5.0", client_id=cid, session=60, clean=False)
    assert back.session_present
    back.nothing()  # nothing was kept for it while away
    then = [f"b{i}".encode() for i in range(4)]
    for p in then:
        pub.publish("ks/t", p, qos=1)
    mine = [back.message() for _ in range(2)]
    theirs = [other.message().payload for _ in range(2)]
    assert all(m.qos == 1 for m in mine), "its QoS 1 shared subscription, with no SUBSCRIBE"
    assert sorted([m.payload for m in mine] + theirs) == then, "in the group again: turns"
    back.nothing(0.1)
    other.nothing(0.1)
    for c in (back, other, pub):
        c.close()
