"""Typed exceptions: one class per error code herald sends (docs/protocol.md, "Errors"), plus the
client's own conditions (not connected, closed, timeout, a gap in a subscription's stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._types import Gap, Subscribed


class HeraldError(Exception):
    """An error herald reported, or one of the client's own. `code` is herald's stable error code
    (e.g. ``invalid_topic``) or the client's (``not_connected``, ``closed``, ``timeout``, ``gap``)."""

    code: str = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ServerError(HeraldError):
    """herald refused a request (an ``{"op":"error"}`` reply); `code` says why."""


class BadRequest(ServerError):
    """The request was malformed (``bad_json``, ``bad_frame``, ``unknown_op``, ``missing_field``)."""


class InvalidTopic(ServerError):
    code = "invalid_topic"


class PublishToPattern(ServerError):
    code = "publish_to_pattern"


class TooManySubscriptions(ServerError):
    code = "too_many_subscriptions"


class NotSubscribed(ServerError):
    code = "not_subscribed"


class NotLossless(ServerError):
    code = "not_lossless"


class MessageTooLarge(ServerError):
    code = "message_too_large"


class Unauthorized(ServerError):
    """No token, or one herald refused; herald then closes the connection (4003)."""

    code = "unauthorized"


class Forbidden(ServerError):
    """The token does not grant this subscription or publish; the connection stays open."""

    code = "forbidden"


class RateLimited(ServerError):
    code = "rate_limited"


_BY_CODE: dict[str, type[ServerError]] = {
    "bad_json": BadRequest,
    "bad_frame": BadRequest,
    "unknown_op": BadRequest,
    "missing_field": BadRequest,
    "invalid_topic": InvalidTopic,
    "publish_to_pattern": PublishToPattern,
    "too_many_subscriptions": TooManySubscriptions,
    "not_subscribed": NotSubscribed,
    "not_lossless": NotLossless,
    "message_too_large": MessageTooLarge,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "rate_limited": RateLimited,
}


def server_error(code: str, message: str) -> ServerError:
    """The exception for an error herald sent: its class by code, `ServerError` for codes this
    client does not know (herald may add some)."""
    return _BY_CODE.get(code, ServerError)(message, code)


class NotConnected(HeraldError):
    """The connection closed (or could not be opened) before herald replied."""

    code = "not_connected"


class ConnectionLost(HeraldError):
    """herald closed the connection for good: no reconnect follows (e.g. 4003, or
    ``reconnect=False``). `close_code` and `close_reason` are the WebSocket close frame's."""

    code = "closed"

    def __init__(self, message: str, close_code: int | None, close_reason: str) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.close_reason = close_reason


class ClientClosed(HeraldError):
    """The client was closed by its owner."""

    code = "closed"


class RequestTimeout(HeraldError):
    code = "timeout"


class GapError(HeraldError):
    """herald could not replay everything a subscription missed: `subscribed.gaps` says exactly
    what is lost (``history_trimmed``, ``epoch_changed``, ``unknown_topic``). Raised by a
    subscription's iterator at the point of the stream where the loss is; iterating again goes
    on with the replayed and live messages that follow."""

    code = "gap"

    def __init__(self, subscribed: Subscribed) -> None:
        lost = ", ".join(g.describe() for g in subscribed.gaps) or "herald reported recovered=false"
        super().__init__(f"subscription {subscribed.pattern!r} did not recover everything: {lost}")
        self.subscribed = subscribed

    @property
    def gaps(self) -> tuple[Gap, ...]:
        return self.subscribed.gaps
