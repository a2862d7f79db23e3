"""A small synchronous facade for scripts: the asyncio client runs on an event loop in a
background thread, and these calls block until it has done their work.

    from herald_client.sync import connect

    with connect("ws://127.0.0.1:8080/ws") as h:
        sub = h.subscribe("quotes/>", snapshot=True)
        h.publish("quotes/fx/EURUSD", "1.0842")
        for m in sub:
            print(m.topic, m.seq, m.data)

Event listeners (`on`) are called on the background thread. A handler given to `subscribe` runs
in a worker thread, one message at a time, so a slow handler never stalls the connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Literal, TypeVar

from ._client import Client as AsyncClient
from ._client import Subscription as AsyncSubscription
from ._client import TokenSource
from ._client import connect as async_connect
from ._errors import ClientClosed, RequestTimeout
from ._types import Ack, Message, Policy, Position

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (the `uvloop` extra), else asyncio's: loop turns
    and socket transports are most of what a small message costs the client beside the kernel's
    work, and uvloop's cost less (`bench/throughput.py --uvloop` compares the two)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Loop:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="herald-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking herald_client.sync call cannot be made from an event listener")
        if not self.thread.is_alive():
            coro.close()
            raise ClientClosed("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeout(f"nothing within {timeout} s") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Subscription:
    """A subscription whose messages are read by iterating (``for m in sub``) or with `get`."""

    def __init__(self, loop: _Loop, sub: AsyncSubscription) -> None:
        self._loop = loop
        self._sub = sub

    @property
    def pattern(self) -> str:
        return self._sub.pattern

    @property
    def positions(self) -> dict[str, Position]:
        return self._sub.positions

    def get(self, timeout: float | None = None) -> Message:
        """The next message (`RequestTimeout` if none comes within `timeout` seconds;
        `StopIteration` once the subscription or the client ended; `GapError` where herald
        reported a loss)."""
        if not self._loop.thread.is_alive():
            raise StopIteration
        try:
            return self._loop.run(self._sub.__anext__(), timeout)
        except StopAsyncIteration:
            raise StopIteration from None

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        return self.get()

    def unsubscribe(self) -> None:
        self._loop.run(self._sub.unsubscribe())


class Client:
    """The synchronous counterpart of `herald_client.Client`; make one with `connect()`."""

    def __init__(self, url: str, **options: Any) -> None:
        self._loop = _Loop()
        try:
            self._client: AsyncClient = self._loop.run(self._connect(url, options))
        except BaseException:
            self._loop.stop()
            raise

    @staticmethod
    async def _connect(url: str, options: dict[str, Any]) -> AsyncClient:
        return await async_connect(url, **options)

    @property
    def state(self) -> str:
        return self._client.state

    def publish(
        self, topic: str, data: Any, *, ct: str | None = None, stamp: bool = False, ack: bool = True
    ) -> Ack | None:
        return self._loop.run(self._client.publish(topic, data, ct=ct, stamp=stamp, ack=ack))

    def subscribe(
        self,
        pattern: str,
        handler: Callable[[Message], None] | None = None,
        *,
        snapshot: bool = False,
        since: Mapping[str, Position | tuple[int, str]] | None = None,
        policy: Policy | None = None,
        max_rate: float | None = None,
        window: int | None = None,
        window_bytes: int | None = None,
        buffer: int | None = None,
    ) -> Subscription:
        async def threaded(m: Message) -> None:
            assert handler is not None
            await asyncio.to_thread(handler, m)

        sub = self._loop.run(
            self._client.subscribe(
                pattern,
                threaded if handler is not None else None,
                snapshot=snapshot,
                since=since,
                policy=policy,
                max_rate=max_rate,
                window=window,
                window_bytes=window_bytes,
                buffer=buffer,
            )
        )
        return Subscription(self._loop, sub)

    def ping(self) -> None:
        self._loop.run(self._client.ping())

    def on(
        self, event: Literal["state", "dropped", "error", "resubscribed"], listener: Callable[[Any], None]
    ) -> Callable[[], None]:
        """As `herald_client.Client.on`; the listener runs on the client's background thread."""
        return self._client._add_listener(event, listener)

    def close(self) -> None:
        if self._loop.thread.is_alive():
            self._loop.run(self._client.close())
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    url: str,
    *,
    token: TokenSource | None = None,
    token_in: Literal["header", "query", "message"] = "header",
    reconnect: bool = True,
    min_delay: float = 0.25,
    max_delay: float = 10.0,
    request_timeout: float = 10.0,
    refresh_before: float = 30.0,
    buffer: int = 1024,
) -> Client:
    """Connects like `herald_client.connect` and returns a blocking `Client`."""
    return Client(
        url,
        token=token,
        token_in=token_in,
        reconnect=reconnect,
        min_delay=min_delay,
        max_delay=max_delay,
        request_timeout=request_timeout,
        refresh_before=refresh_before,
        buffer=buffer,
    )
