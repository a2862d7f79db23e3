"""herald-client: an asyncio client for herald, the real-time WebSocket messaging router.

    async with herald_client.connect("ws://127.0.0.1:8080/ws") as h:
        sub = await h.subscribe("quotes/>", snapshot=True)
        await h.publish("quotes/fx/EURUSD", "1.0842")
        async for m in sub:
            print(m.topic, m.seq, m.data)

`herald_client.sync` offers the same for scripts without asyncio.
"""

from ._client import Client, Subscription, connect
from ._errors import (
    BadRequest,
    ClientClosed,
    ConnectionLost,
    Forbidden,
    GapError,
    HeraldError,
    InvalidTopic,
    MessageTooLarge,
    NotConnected,
    NotLossless,
    NotSubscribed,
    PublishToPattern,
    RateLimited,
    RequestTimeout,
    ServerError,
    TooManySubscriptions,
    Unauthorized,
)
from ._types import Ack, Dropped, Gap, Message, Policy, Position, Resubscribed, StateEvent, Subscribed, topic_matches

__all__ = [
    "Ack",
    "BadRequest",
    "Client",
    "ClientClosed",
    "ConnectionLost",
    "Dropped",
    "Forbidden",
    "Gap",
    "GapError",
    "HeraldError",
    "InvalidTopic",
    "Message",
    "MessageTooLarge",
    "NotConnected",
    "NotLossless",
    "NotSubscribed",
    "Policy",
    "Position",
    "PublishToPattern",
    "RateLimited",
    "RequestTimeout",
    "Resubscribed",
    "ServerError",
    "StateEvent",
    "Subscribed",
    "Subscription",
    "TooManySubscriptions",
    "Unauthorized",
    "connect",
    "topic_matches",
]
