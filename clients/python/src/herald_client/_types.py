"""The values the client hands out (messages, replies, events) and the wire helpers they need:
topic matching and the binary frame layout of docs/protocol.md."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

Policy = Literal["disconnect", "drop", "conflate", "lossless"]
POLICIES: frozenset[str] = frozenset(("disconnect", "drop", "conflate", "lossless"))

State = Literal["connecting", "open", "reconnecting", "closed"]


class Position(NamedTuple):
    """The last message seen of one topic: what `since` asks herald to continue after."""

    seq: int
    epoch: str


@dataclass(frozen=True, slots=True)
class Gap:
    """What a (re)subscription could not recover (docs/protocol.md, "Subscribe")."""

    topic: str
    reason: str  # "history_trimmed", "epoch_changed" or "unknown_topic"
    first: int | None = None  # history_trimmed: the first missing seq (herald's `from`)
    last: int | None = None  # history_trimmed: the last missing seq (herald's `to`)
    epoch: str | None = None  # epoch_changed: the topic's new epoch

    @classmethod
    def from_wire(cls, g: Mapping[str, Any]) -> Gap:
        return cls(str(g.get("topic")), str(g.get("reason")), g.get("from"), g.get("to"), g.get("epoch"))

    def describe(self) -> str:
        if self.reason == "history_trimmed":
            return f"{self.topic} seq {self.first}..={self.last} trimmed"
        if self.reason == "epoch_changed":
            return f"{self.topic} epoch changed to {self.epoch}"
        return f"{self.topic} {self.reason}"


@dataclass(frozen=True, slots=True)
class Subscribed:
    """herald's reply to a subscribe. `recovered` is None when the request asked for no recovery
    (no `since`, no cursor); `cursor` is None from a herald that does not send one."""

    pattern: str
    recovered: bool | None
    replayed: int
    gaps: tuple[Gap, ...]
    cursor: str | None

    @classmethod
    def from_wire(cls, r: Mapping[str, Any]) -> Subscribed:
        return cls(
            pattern=str(r.get("topic")),
            recovered=r.get("recovered"),
            replayed=int(r.get("replayed") or 0),
            gaps=tuple(Gap.from_wire(g) for g in r.get("gaps") or ()),
            cursor=r.get("cursor"),
        )


@dataclass(frozen=True, slots=True)
class Ack:
    topic: str
    seq: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """herald dropped `count` messages of `topic` for this connection (`reason`: drop, conflate,
    remote). The next message of the topic carries the same count in `Message.dropped`."""

    topic: str
    count: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class StateEvent:
    state: State
    attempt: int | None = None  # reconnect attempt, 1 = the first retry
    delay: float | None = None  # seconds waited before this attempt
    code: int | None = None  # close code of the connection that ended
    reason: str | None = None  # close reason of the connection that ended


@dataclass(frozen=True, slots=True)
class Resubscribed:
    """A subscription renewed after a reconnect. `recovered` is herald's word: False means
    `gaps` lists what is lost for good."""

    pattern: str
    recovered: bool
    replayed: int
    gaps: tuple[Gap, ...] = field(default=())


class Message:
    """One message. `data` is a `str` for text messages and `bytes` for binary ones (a copy of
    the payload, made once); `payload` is a read-only `memoryview` of a binary payload that
    shares the received frame (no copy), e.g. for ``numpy.frombuffer(m.payload, ...)``. `dropped`
    counts messages of this topic herald dropped for the connection right before this one (a
    slow-consumer policy, announced by herald)."""

    __slots__ = ("_bytes", "_frame", "_offset", "_text", "ct", "dropped", "epoch", "seq", "topic", "ts")

    def __init__(
        self, head: Mapping[str, Any], text: str | None, frame: bytes | bytearray = b"", offset: int = 0
    ) -> None:
        self.topic: str = head["topic"]
        self.seq: int = head["seq"]
        self.epoch: str = head["epoch"]
        self.ct: str | None = head.get("ct")
        self.ts: int | None = head.get("ts")  # herald's receive time, µs since the UNIX epoch
        self.dropped: int = 0
        self._text = text
        self._frame = frame
        self._offset = offset
        self._bytes: bytes | None = None

    @property
    def binary(self) -> bool:
        return self._text is None

    @property
    def data(self) -> str | bytes:
        if self._text is not None:
            return self._text
        if self._bytes is None:
            with memoryview(self._frame) as frame:
                self._bytes = bytes(frame[self._offset :])
        return self._bytes

    @property
    def payload(self) -> memoryview:
        if self._text is not None:
            return memoryview(self._text.encode())
        return memoryview(self._frame).toreadonly()[self._offset :]

    @property
    def size(self) -> int:
        """Payload bytes as herald counts them for a byte window: UTF-8 bytes of text, the bytes
        after the header of a binary message."""
        if self._text is not None:
            return len(self._text) if self._text.isascii() else len(self._text.encode())
        return len(self._frame) - self._offset

    def text(self) -> str:
        """The payload as a string (binary payloads decoded as UTF-8)."""
        return self._text if self._text is not None else bytes(self.payload).decode()

    def json(self) -> Any:
        return json.loads(self.text())

    def __repr__(self) -> str:
        kind = "text" if self._text is not None else "binary"
        return f"<Message {self.topic} seq={self.seq} epoch={self.epoch} {kind} {self.size} bytes>"


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether an exact `topic` matches `pattern`: ``*`` is exactly one level, ``>`` as the last
    level one or more; both are wildcards only as a whole level (herald-core's grammar)."""
    p = pattern.split("/")
    t = topic.split("/")
    for i, level in enumerate(p):
        if level == ">" and i == len(p) - 1:
            return len(t) > i
        if i >= len(t) or (level != "*" and level != t[i]):
            return False
    return len(p) == len(t)


_LEN = struct.Struct(">I")


def encode_json(value: Any) -> bytes:
    """`value` as compact JSON (the encoder made once: `json.dumps` with `separators` makes a new
    one per call, which costs more than encoding a short request)."""
    return _ENCODER.encode(value).encode()


def encode_head(head: Mapping[str, Any]) -> bytes:
    """The first part of a binary frame: 4-byte big-endian header length, then the JSON header."""
    h = encode_json(head)
    return _LEN.pack(len(h)) + h


def decode_head(text: str) -> dict[str, Any]:
    """A message's JSON object: a text message, or a binary frame's header. (The decoder's
    `raw_decode` skips the type dispatch and whitespace scans of `json.loads`, which on a short
    header cost as much as the parse itself; herald writes no whitespace around the object and
    nothing after it.)"""
    head, end = _DECODER.raw_decode(text)
    if end != len(text):
        raise ValueError("data after the JSON object")
    if not isinstance(head, dict):
        raise ValueError("not a JSON object")
    return head


def decode_frame(frame: bytes | bytearray) -> tuple[dict[str, Any], int]:
    """A binary frame's JSON header and the offset where its payload starts."""
    if len(frame) < 4:
        raise ValueError("binary frame shorter than 4 bytes")
    (n,) = _LEN.unpack_from(frame)
    if 4 + n > len(frame):
        raise ValueError("binary frame shorter than its header length")
    return decode_head(frame[4 : 4 + n].decode()), 4 + n


_DECODER = json.JSONDecoder()
_ENCODER = json.JSONEncoder(separators=(",", ":"))
