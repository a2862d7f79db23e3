"""MQTT 5.0 across a herald cluster (docs/mqtt.md, docs/cluster.md): two nodes joined by a
real `nats-server` (Debian package `nats-server`), Eclipse Paho publishing on one node and
subscribing on the other. Every process is started here on free loopback ports and ended by
PID; every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import time

import pytest
import requests
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_mqtt import Client, granted
from test_protocol import STARTUP, Herald, free_port


def nats_server() -> str:
    """Debian installs `nats-server` in /usr/sbin, which a user's PATH may lack."""
    debian = "/usr/sbin/nats-server"
    found = shutil.which("nats-server") or (debian if os.path.exists(debian) else None)
    if not found:
        pytest.fail("no nats-server (apt-get install nats-server)")
    return found


def metric(server: Herald, name: str) -> float | None:
    text = requests.get(f"{server.http}/metrics", timeout=STARTUP).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.fixture(scope="module")
def cluster():
    port = free_port()
    nats = subprocess.Popen(
        [nats_server(), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    nodes = []
    try:
        deadline = time.monotonic() + STARTUP
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline, "nats-server did not listen"
            time.sleep(0.05)
        for _ in range(2):
            mqtt_port = free_port()
            node = Herald("--mqtt-listen", f"127.0.0.1:{mqtt_port}", "--nats", f"nats://127.0.0.1:{port}")
            node.mqtt_port = mqtt_port
            nodes.append(node)
        for node in nodes:
            deadline = time.monotonic() + STARTUP
            while metric(node, "herald_cluster_nats_connected") != 1:
                assert time.monotonic() < deadline, "herald did not join NATS"
                time.sleep(0.05)
        yield nodes
        for node in nodes:
            node.stop_and_check()
    finally:
        for node in nodes:
            node.close()
        nats.kill()
        nats.wait(timeout=STARTUP)


def following(pub: Client, sub: Client, topic: str) -> None:
    """Publishes on `topic` from one node until the other node's subscriber gets a message: it
    follows the topic on NATS from then on. The subscriber's queue is left empty."""
    deadline = time.monotonic() + STARTUP
    while True:
        assert time.monotonic() < deadline, f"{topic} never reached the other node"
        pub.publish(topic, b"probe")
        try:
            sub.messages.get(timeout=0.2)
            break
        except queue.Empty:
            pass
    time.sleep(0.3)
    while not sub.messages.empty():
        sub.messages.get()


def properties(expiry: int | None) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("b", "1"), ("a", "2"), ("b", "3"), ("ünï", "")]
    props.ResponseTopic = "xc/reply"
    props.CorrelationData = b"\x00\x01req\xff"
    props.PayloadFormatIndicator = 1
    props.ContentType = "text/plain; charset=utf-8"
    if expiry is not None:
        props.MessageExpiryInterval = expiry
    return props


def test_properties_expiry_retain_and_qos_cross_the_cluster(cluster):
    a, b = cluster
    sub = Client(b, "5.0")
    assert granted(sub.subscribe("xc/#", qos=1, retainAsPublished=True)) == [1]
    pub = Client(a, "5.0")
    following(pub, sub, "xc/probe")

    pub.publish("xc/t", "héllo".encode(), qos=1, properties=properties(60))
    m = sub.message()
    assert (m.topic, m.payload, m.qos, m.retain) == ("xc/t", "héllo".encode(), 1, False)
    got = m.properties
    assert got.UserProperty == [("b", "1"), ("a", "2"), ("b", "3"), ("ünï", "")]
    assert (got.ResponseTopic, got.CorrelationData) == ("xc/reply", b"\x00\x01req\xff")
    assert (got.PayloadFormatIndicator, got.ContentType) == (1, "text/plain; charset=utf-8")
    assert got.MessageExpiryInterval in (59, 60), "what is left of it, never more"

    # The retain flag (retain as published) and a QoS 0 publisher's QoS cross too.
    pub.publish("xc/r", b"kept", qos=1, retain=True)
    pub.publish("xc/q0", b"at most once", qos=0)
    m = sub.message()
    assert (m.topic, m.payload, m.retain, m.qos) == ("xc/r", b"kept", True, 1)
    m = sub.message()
    assert (m.topic, m.payload, m.qos) == ("xc/q0", b"at most once", 0), "the lower of the two"
    sub.nothing()

    # Retained messages are kept by the node they were published on (docs/mqtt.md).
    for node, expected in [(a, [b"kept"]), (b, [])]:
        late = Client(node, "5.0")
        late.subscribe("xc/r", qos=1)
        got = []
        try:
            got.append(late.messages.get(timeout=0.5).payload)
        except queue.Empty:
            pass
        assert got == expected
        late.close()
    sub.close()
    pub.close()


def test_the_expiry_keeps_counting_down_on_the_other_node(cluster):
    """A session kept on node B while its client is away: a message from node A waits there,
    and what the client is sent when it comes back is what is left of the interval; a message
    whose interval passed meanwhile is not sent at all."""
    a, b = cluster
    sub = Client(b, "5.0", client_id="xc-away", session=60)
    assert granted(sub.subscribe("xe/#", qos=1)) == [1]
    pub = Client(a, "5.0")
    following(pub, sub, "xe/probe")
    sub.drop()
    time.sleep(0.2)
    pub.publish("xe/short", b"gone", qos=1, properties=properties(1))
    pub.publish("xe/long", b"left", qos=1, properties=properties(4))
    time.sleep(2.2)
    back = Client(b, "5.0", client_id="xc-away", session=60, clean=False)
    assert back.session_present
    m = back.message()
    assert (m.topic, m.payload) == ("xe/long", b"left"), "the expired one is not sent"
    assert m.properties.MessageExpiryInterval in (1, 2), m.properties.MessageExpiryInterval
    assert m.properties.UserProperty == [("b", "1"), ("a", "2"), ("b", "3"), ("ünï", "")]
    back.nothing()
    back.close()
    pub.close()
