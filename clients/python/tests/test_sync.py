"""The synchronous facade against a real herald."""

from __future__ import annotations

import threading

import pytest
from conftest import Herald

import herald_client
from herald_client import Message, sync


def test_sync_publish_iterate_and_handler(herald: Herald) -> None:
    with sync.connect(herald.url) as h:
        sub = h.subscribe("s1/>", snapshot=True)
        ack = h.publish("s1/a", "hello", ct="text/plain")
        assert ack is not None and ack.seq == 1
        h.publish("s1/b", b"\x00\x01", ack=False)
        first, second = sub.get(timeout=5), sub.get(timeout=5)
        assert (first.topic, first.data, first.ct) == ("s1/a", "hello", "text/plain")
        assert (second.topic, second.data) == ("s1/b", b"\x00\x01")
        with pytest.raises(herald_client.RequestTimeout):
            sub.get(timeout=0.2)

        got: list[Message] = []
        handled = threading.Event()

        def handler(m: Message) -> None:
            got.append(m)
            handled.set()

        h.subscribe("s1/c", handler, policy="lossless", window=1)
        h.publish("s1/c", "x")
        assert handled.wait(5) and [m.data for m in got] == ["x"]

        with pytest.raises(herald_client.InvalidTopic):
            h.publish("s1//c", "x")
        h.ping()
        sub.unsubscribe()
        with pytest.raises(StopIteration):
            next(sub)
    assert h.state == "closed"


def test_sync_iteration_ends_when_the_client_closes(herald: Herald) -> None:
    h = sync.connect(herald.url)
    sub = h.subscribe("s2/x")
    h.publish("s2/x", "1")
    h.close()
    assert list(sub) == []  # what was still queued goes with the client
    with pytest.raises(herald_client.ClientClosed):
        h.publish("s2/x", "2")
