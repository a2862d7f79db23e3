"""The asyncio client for herald's native protocol (docs/protocol.md).

It makes the delivery contract (docs/semantics.md) easy to use: it remembers the last position
seen per topic and subscription, reconnects with exponential backoff and jitter, resubscribes
with `since` and the subscription's cursor, and says whether the gap was fully recovered (a
`resubscribed` event, and a `GapError` from the subscription's iterator when it was not).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import inspect
import json
import logging
import random
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, Literal, TypeAlias, TypeVar, overload

from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from ._connection import Connection
from ._errors import (
    ClientClosed,
    ConnectionLost,
    GapError,
    HeraldError,
    NotConnected,
    RequestTimeout,
    ServerError,
    Unauthorized,
    server_error,
)
from ._types import (
    POLICIES,
    Ack,
    Dropped,
    Message,
    Policy,
    Position,
    Resubscribed,
    State,
    StateEvent,
    Subscribed,
    decode_frame,
    decode_head,
    encode_head,
    encode_json,
    topic_matches,
)

log = logging.getLogger("herald_client")

T = TypeVar("T")
TokenSource: TypeAlias = str | Callable[[], str | Awaitable[str]]
Handler: TypeAlias = Callable[[Message], Awaitable[None] | None]
GapHandler: TypeAlias = Callable[[GapError], Awaitable[None] | None]


class _Ticket:
    """The lossless credit one live message spent at herald: granted back once every lossless
    subscription of `pattern` that took the message has handled it. `batch` is how many messages
    (and payload bytes) may be granted together while more handled ones follow."""

    __slots__ = ("batch", "bytes", "pattern", "pending", "ws")

    def __init__(self, pattern: str, nbytes: int, ws: Connection | None, batch: tuple[int, int]) -> None:
        self.pattern = pattern
        self.bytes = nbytes
        self.ws = ws
        self.batch = batch
        self.pending = 0


class _Route:
    """A pattern whose subscriptions take messages of some topic, with what delivering them needs:
    whether one is lossless (a message spends its credit), has a byte window, and its credit batch."""

    __slots__ = ("batch", "byte_window", "lossless", "pattern", "subs")

    def __init__(self, pattern: str, subs: list[Subscription]) -> None:
        self.pattern = pattern
        self.subs = subs
        self.lossless = any(s.lossless for s in subs)
        self.byte_window = any(s.byte_window for s in subs)
        self.batch = _credit_batch(subs)


class _End:
    """Queued last in a subscription's inbox: iteration stops (or raises `error`)."""

    __slots__ = ("error",)

    def __init__(self, error: HeraldError | None) -> None:
        self.error = error


_Item: TypeAlias = tuple[Message, _Ticket | None] | GapError | _End


class _Inbox:
    """A subscription's queue. `limit` bounds the messages waiting for a slow consumer: once it is
    full the client stops reading the socket (`crowded` is set, and `on_room` called when it has
    room again), so herald's slow-consumer policy acts instead of the client's memory growing.
    Gap reports and the end marker always fit."""

    def __init__(self, limit: int, on_room: Callable[[_Inbox], None]) -> None:
        self._items: deque[_Item] = deque()
        self._limit = limit
        self._on_room = on_room
        self._waiter: asyncio.Future[None] | None = None
        self.crowded = False

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: _Item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def pop(self) -> _Item:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items[0]
        if not isinstance(item, _End):  # the end marker stays for any later reader
            self._items.popleft()
        if self.crowded and not self.full():
            self.crowded = False
            self._on_room(self)
        return item

    def end(self, item: _End, discard: bool) -> None:
        """Queues the end marker, after what is queued or (`discard`) instead of it; from now on
        it is never full (no one may read)."""
        if discard:
            self._items.clear()
        self._limit = 0
        self.push(item)
        if self.crowded:
            self.crowded = False
            self._on_room(self)

    def full(self) -> bool:
        return bool(self._limit) and len(self._items) >= self._limit


class Subscription:
    """One `subscribe` call: an async iterator of `Message` (``async for m in sub``), or, with a
    handler, a task calling it. Several subscriptions may share a pattern; herald holds it once.

    For a ``lossless`` subscription the client grants herald credit for a message once it has
    been handled: when the iterator is asked for the next message, or when the handler returned.
    """

    def __init__(
        self,
        client: Client,
        pattern: str,
        options: dict[str, Any],
        since: Mapping[str, Position],
        buffer: int,
        handler: Handler | None,
        on_gap: GapHandler | None,
    ) -> None:
        self.pattern = pattern
        self.options = options
        self.lossless = options.get("policy") == "lossless"
        self.byte_window = self.lossless and "window_bytes" in options
        # The last position seen per topic: the `since` of a resubscribe.
        self.positions: dict[str, Position] = dict(since)
        # herald's first reply: its cursor is what every resubscribe asks to continue after.
        self.subscribed: Subscribed | None = None
        self.active = True
        self._client = client
        self._ready: asyncio.Future[Subscribed] = asyncio.get_running_loop().create_future()
        self._inbox = _Inbox(0 if self.lossless else buffer, client._has_room)
        self._handled: _Ticket | None = None
        self._handler = handler
        self._on_gap = on_gap
        self._task: asyncio.Task[None] | None = None

    @property
    def cursor(self) -> str | None:
        return self.subscribed.cursor if self.subscribed else None

    def accept(self, m: Message) -> bool:
        """Whether this subscription should see `m`: drops what it already saw (a snapshot or
        replay may repeat a message), accepts a new epoch."""
        last = self.positions.get(m.topic)
        if last is not None and last.epoch == m.epoch and m.seq <= last.seq:
            return False
        self.positions[m.topic] = Position(m.seq, m.epoch)
        return True

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        if self._handler is not None:
            raise TypeError("this subscription delivers to its handler; it cannot be iterated")
        self._done_with_last()
        item = await self._inbox.pop()
        if isinstance(item, _End):
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        if isinstance(item, GapError):
            raise item
        m, ticket = item
        self._handled = ticket
        return m

    def _done_with_last(self) -> None:
        ticket, self._handled = self._handled, None
        if ticket is not None:
            self._client._handled(ticket, idle=not self._inbox)

    async def _run_handler(self, handler: Handler) -> None:
        while True:
            item = await self._inbox.pop()
            if isinstance(item, _End):
                return
            if isinstance(item, GapError):
                await self._report_gap(item)
                continue
            m, ticket = item
            if self.active:
                try:
                    result = handler(m)
                    if inspect.isawaitable(result):
                        await result
                except Exception as e:
                    self._client._emit_error(
                        HeraldError(f"the handler for {self.pattern} raised on {m.topic}: {e!r}", "handler")
                    )
            if ticket is not None:
                self._client._handled(ticket, idle=not self._inbox)

    async def _report_gap(self, gap: GapError) -> None:
        if self._on_gap is None:
            log.warning("%s", gap)
            return
        try:
            result = self._on_gap(gap)
            if inspect.isawaitable(result):
                await result
        except Exception as e:
            self._client._emit_error(HeraldError(f"the gap handler for {self.pattern} raised: {e!r}", "handler"))

    def _end(self, error: HeraldError | None) -> None:
        """Ends delivery. Messages already queued are still delivered before an `error` (they
        are valid); without one (unsubscribed, or the client closed) they are discarded."""
        self.active = False
        self._inbox.end(_End(error), discard=error is None)

    async def unsubscribe(self) -> None:
        """Stops delivery (the iterator ends) and unsubscribes at herald if this was the
        pattern's last subscription."""
        await self._client._unsubscribe(self)


Event = Literal["state", "dropped", "error", "resubscribed"]
Listener = Callable[[Any], None]


class Client:
    """A connection to herald that reconnects until `close()`. Make one with `connect()`."""

    def __init__(
        self,
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
    ) -> None:
        if token_in not in ("header", "query", "message"):
            raise ValueError(f"token_in must be 'header', 'query' or 'message', not {token_in!r}")
        self.url = url
        self.state: State = "connecting"
        self._token = token
        self._token_in = token_in
        self._reconnect = reconnect
        self._min_delay = min_delay
        self._max_delay = max_delay
        self._timeout = request_timeout
        self._refresh_before = refresh_before
        self._buffer = buffer
        self._ws: Connection | None = None
        self._next_id = 1
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], Callable[[dict[str, Any]], None] | None]] = {}
        # Subscriptions by pattern, in the order herald first saw the patterns (its tie-break
        # for which lossless subscription a message charges).
        self._patterns: dict[str, list[Subscription]] = {}
        # Per topic, the patterns that take it: found once, forgotten when subscriptions change.
        self._routes: dict[str, list[_Route]] = {}
        # Lossless credit earned and not yet granted, per pattern: [messages, payload bytes].
        self._credits: dict[str, list[int]] = {}
        self._credit_flush: asyncio.Task[None] | None = None
        self._grant_soon = False
        # Inboxes full: while there is one, the socket is not read.
        self._crowded: set[_Inbox] = set()
        # Message frames still to come that a `subscribed` reply announced as replayed, or a
        # `snapshot` notice as more of a snapshot: they spent no lossless credit, so none is
        # granted back for them.
        self._replayed_to_come = 0
        # Dropped counts announced per topic, attached to the topic's next message.
        self._dropped: dict[str, int] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._opened = asyncio.Event()
        self._live = False  # a connection is set up and in use (not an attempt in progress)
        self._refresh_task: asyncio.Task[None] | None = None
        self._last_error: HeraldError | None = None
        self._fatal: HeraldError | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ----------------------------------------------------------------------------------------
    # Events

    @overload
    def on(self, event: Literal["state"], listener: Callable[[StateEvent], None]) -> Callable[[], None]: ...
    @overload
    def on(self, event: Literal["dropped"], listener: Callable[[Dropped], None]) -> Callable[[], None]: ...
    @overload
    def on(self, event: Literal["error"], listener: Callable[[HeraldError], None]) -> Callable[[], None]: ...
    @overload
    def on(self, event: Literal["resubscribed"], listener: Callable[[Resubscribed], None]) -> Callable[[], None]: ...
    def on(self, event: Event, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Calls `listener` on `state` changes, `dropped` notices, `error`s no request was
        waiting for, and `resubscribed` reports after a reconnect. Returns a remover."""
        return self._add_listener(event, listener)

    def _add_listener(self, event: str, listener: Callable[[Any], None]) -> Callable[[], None]:
        if event not in ("state", "dropped", "error", "resubscribed"):
            raise ValueError(f"unknown event {event!r}")
        listeners = self._listeners.setdefault(event, [])
        listeners.append(listener)
        return lambda: listeners.remove(listener) if listener in listeners else None

    def _emit(self, event: Event, detail: object) -> None:
        for listener in list(self._listeners.get(event, ())):
            try:
                listener(detail)
            except Exception:
                log.exception("a %s listener raised", event)

    def _emit_error(self, error: HeraldError) -> None:
        if not self._listeners.get("error"):
            log.warning("%s", error)
        self._emit("error", error)

    def _set_state(self, state: State, **extra: Any) -> None:
        self.state = state
        self._emit("state", StateEvent(state, **extra))

    def _spawn(self, coro: Awaitable[T]) -> asyncio.Task[T]:
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ----------------------------------------------------------------------------------------
    # Connecting

    async def _token_now(self) -> str | None:
        t = self._token
        if t is None or isinstance(t, str):
            return t
        value = t()
        return await value if inspect.isawaitable(value) else value

    async def _open(self) -> None:
        """One connection attempt: the WebSocket, then an `auth` or `ping` round trip (herald
        answers a refused token with an error and a 4003 close, so this is where it shows)."""
        try:
            token = await self._token_now()
        except Exception as e:
            raise HeraldError(f"the token callback failed: {e!r}", "token") from e
        url, headers = self.url, {}
        if token and self._token_in == "query":
            parts = urllib.parse.urlsplit(url)
            query = [*urllib.parse.parse_qsl(parts.query), ("token", token)]
            url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
        elif token and self._token_in == "header":
            headers["Authorization"] = f"Bearer {token}"
        try:
            ws = await ws_connect(
                url,
                additional_headers=headers,
                max_size=None,  # herald bounds message sizes (max_message_bytes)
                compression=None,  # herald does not negotiate permessage-deflate
                open_timeout=self._timeout,
                create_connection=Connection,
            )
        except InvalidURI as e:
            raise HeraldError(f"cannot open a WebSocket to {self.url}: {e}", "bad_url") from e
        except (OSError, EOFError, InvalidHandshake, ConnectionClosed, asyncio.TimeoutError) as e:
            raise NotConnected(f"cannot connect to {self.url}: {e}") from e
        assert isinstance(ws, Connection)
        self._ws = ws
        self._last_error = None
        ws.attach(functools.partial(self._receive, ws))
        reader = self._spawn(self._watch(ws))
        try:
            if token and self._token_in == "message":
                reply = await self._request({"op": "auth", "token": token})
                self._schedule_refresh(reply.get("exp"))
            else:
                await self._request({"op": "ping"})
                if token:
                    # herald does not report the expiry of a token that came with the upgrade.
                    self._schedule_refresh(_jwt_expiry(token))
        except HeraldError as e:
            await ws.close()
            await reader
            if isinstance(e, ServerError):
                raise
            # A refused token comes as an error without an id, then the close.
            raise self._fatal or self._last_error or e from None

    async def _start(self) -> None:
        self._set_state("connecting")
        try:
            await self._open()
        except HeraldError as e:
            self._set_state("closed", reason=str(e))
            raise
        self._connected(reconnected=False)

    def _connected(self, reconnected: bool) -> None:
        self._live = True
        for pattern, subs in self._patterns.items():
            self._send_subscribe(pattern, subs, reconnected)
        self._set_state("open")
        self._opened.set()

    async def _watch(self, ws: Connection) -> None:
        """Waits for the connection to end (every message it brought has been received)."""
        await ws.wait_closed()
        self._closed(ws, ws.close_code, ws.close_reason or "")

    def _closed(self, ws: Connection, code: int | None, reason: str) -> None:
        if ws is not self._ws:
            return
        self._ws = None
        self._opened.clear()
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        for fut, on_reply in self._pending.values():
            # Subscribes go again on the next connection; their subscriptions wait for that.
            if on_reply is None and not fut.done():
                fut.set_exception(NotConnected(f"the connection closed ({code} {reason}) before herald replied"))
        self._pending.clear()
        self._credits.clear()  # a new subscription starts with a fresh window
        self._replayed_to_come = 0
        self._dropped.clear()
        live, self._live = self._live, False
        if self.state == "closed" or not live:
            return  # closed by its owner, or a connection attempt that failed (the caller retries)
        if code == 4003 or not self._reconnect or self._fatal is not None:
            error = self._fatal
            if error is None and code == 4003:
                error = self._last_error if isinstance(self._last_error, Unauthorized) else None
                error = error or Unauthorized(f"herald closed the connection: 4003 {reason}")
            self._shut(error or ConnectionLost(f"herald closed the connection: {code} {reason}", code, reason))
            return
        self._spawn(self._reconnect_loop(code, reason))

    async def _reconnect_loop(self, code: int | None, reason: str) -> None:
        attempt = 0
        while not self._is_closed():
            attempt += 1
            # Exponential backoff with "equal jitter": half the delay fixed, half random, so that
            # many clients cut off at once (a restart) do not come back in lock step.
            full = min(self._max_delay, self._min_delay * 2 ** (attempt - 1))
            delay = full / 2 + random.random() * full / 2
            self._set_state("reconnecting", attempt=attempt, delay=delay, code=code, reason=reason)
            await asyncio.sleep(delay)
            if self._is_closed():
                return
            try:
                await self._open()
            except Unauthorized as e:
                self._shut(e)
                return
            except HeraldError as e:
                if e.code == "token":
                    self._emit_error(e)
                code, reason = None, str(e)
                continue
            self._connected(reconnected=True)
            return

    def _shut(self, error: HeraldError) -> None:
        """Ends the client for good after `error`: requests and iterators raise it."""
        self._emit_error(error)
        self._set_state("closed", reason=str(error))
        self._fail_all(error)

    def _fail_all(self, error: HeraldError) -> None:
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()
        for subs in self._patterns.values():
            for sub in subs:
                if not sub._ready.done():
                    sub._ready.set_exception(error)
                    sub._ready.exception()  # retrieved: subscribe() may no longer wait for it
                sub._end(None if isinstance(error, ClientClosed) else error)
        self._patterns.clear()
        self._routes.clear()
        self._opened.set()  # wakes waiters, who then see the state

    async def close(self) -> None:
        """Closes the connection for good: no reconnect; iterators end; pending requests fail."""
        if self.state == "closed":
            return
        self._set_state("closed")
        self._fail_all(ClientClosed("the client is closed"))
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close(1000, "client closed")
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_open(self, timeout: float | None = None) -> None:
        """Returns once the connection is open (raises when the client is closed)."""
        try:
            await asyncio.wait_for(self._opened.wait(), timeout)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"not connected within {timeout} s (state {self.state})") from None
        self._check_usable()

    def _is_closed(self) -> bool:
        return self.state == "closed"

    def _check_usable(self) -> None:
        if self.state == "closed":
            raise self._fatal or ClientClosed("the client is closed")

    # ----------------------------------------------------------------------------------------
    # Token refresh

    def _schedule_refresh(self, exp: object) -> None:
        """Re-authenticates on the live connection before the token expires: `refresh_before`
        seconds before `exp`, but never in the first half of the time left, so a token living
        less than that is refreshed once per half-life rather than in a tight loop."""
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        if callable(self._token) and isinstance(exp, (int, float)) and exp > 0:
            self._refresh_task = self._spawn(self._refresh(float(exp)))

    async def _refresh(self, exp: float) -> None:
        left = exp - time.time()
        await asyncio.sleep(max(left - self._refresh_before, left / 2, 0))
        try:
            token = await self._token_now()
            reply = await self._request({"op": "auth", "token": token})
        except HeraldError as e:
            self._emit_error(e)
            return
        except Exception as e:
            self._emit_error(HeraldError(f"the token callback failed: {e!r}", "token"))
            return
        nxt = reply.get("exp")
        # Without a later expiry, refreshing again would only come ever faster until herald
        # refuses the lapsed token: let it close with 4001 and reconnect instead.
        if isinstance(nxt, (int, float)) and nxt > exp:
            self._schedule_refresh(nxt)
        elif nxt is not None:
            self._emit_error(HeraldError("the token callback gave no token that expires later", "token"))

    # ----------------------------------------------------------------------------------------
    # Requests

    def _send_request(
        self,
        body: dict[str, Any],
        binary: bytes | memoryview | None = None,
        on_reply: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[asyncio.Future[dict[str, Any]], Awaitable[None]]:
        rid = self._next_id
        self._next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, on_reply)
        body["id"] = rid
        return fut, self._send(body, binary)

    async def _request(self, body: dict[str, Any], binary: bytes | memoryview | None = None) -> dict[str, Any]:
        fut, sent = self._send_request(body, binary)
        rid = body["id"]
        try:
            await sent
            # A timer that fails the reply's future: cheaper than wait_for's task and callbacks.
            timer = fut.get_loop().call_later(self._timeout, _time_out, fut, body["op"], self._timeout)
            try:
                return await fut
            finally:
                timer.cancel()
        finally:
            self._pending.pop(rid, None)
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: the caller got the send's or the timeout's error

    async def _send(self, body: Mapping[str, Any], binary: bytes | memoryview | None = None) -> None:
        ws = self._ws
        if ws is None:
            raise NotConnected("not connected")
        try:
            if binary is None:
                await ws.send_message(encode_json(body), text=True)
            else:
                await ws.send_binary(encode_head(body), memoryview(binary))
        except (ConnectionClosed, OSError):
            raise NotConnected("the connection closed while sending") from None

    async def ping(self) -> None:
        """An application-level round trip to herald."""
        await self.wait_open(self._timeout)
        await self._request({"op": "ping"})

    async def publish(
        self,
        topic: str,
        data: Any,
        *,
        ct: str | None = None,
        stamp: bool = False,
        ack: bool = True,
    ) -> Ack | None:
        """Publishes to an exact topic. A `str` travels as text; `bytes`, `bytearray`,
        `memoryview` or any object with the buffer protocol (a numpy array) as a binary frame,
        without a copy by the client when it is contiguous; any other value as JSON text
        (`ct` application/json). With `ack` (the default) waits for herald's acknowledgement and
        returns it; `ack=False` returns once the frame is handed to the socket."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        head: dict[str, Any] = {"op": "pub", "topic": topic}
        binary: bytes | memoryview | None = None
        if isinstance(data, str):
            head["data"] = data
        elif isinstance(data, bytes):
            binary = data
        else:
            try:
                view = memoryview(data)
            except TypeError:
                head["data"] = json.dumps(data)
                ct = ct or "application/json"
            else:
                # A non-contiguous view (a strided numpy slice) has to be copied to be sent.
                binary = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        if ct is not None:
            head["ct"] = ct
        if stamp:
            head["stamp"] = True
        if self.state != "open":
            await self.wait_open(self._timeout)
        if not ack:
            await self._send(head, binary)
            return None
        reply = await self._request(head, binary)
        return Ack(reply["topic"], reply["seq"])

    # ----------------------------------------------------------------------------------------
    # Subscriptions

    async def subscribe(
        self,
        pattern: str,
        handler: Handler | None = None,
        *,
        snapshot: bool = False,
        since: Mapping[str, Position | tuple[int, str]] | None = None,
        policy: Policy | None = None,
        max_rate: float | None = None,
        window: int | None = None,
        window_bytes: int | None = None,
        buffer: int | None = None,
        on_gap: GapHandler | None = None,
    ) -> Subscription:
        """Subscribes to `pattern` (wildcards ``*`` and ``>``) and returns once herald confirmed
        it (`Subscription.subscribed` is its reply). Without `handler`, iterate the subscription;
        with one, it is called (and awaited, if it returns an awaitable) for each message in
        order. After a reconnect the subscription is renewed with `since` (its last position per
        topic) and its cursor; what herald could not recover is raised by the iterator as a
        `GapError` (or passed to `on_gap`, or logged) and reported as a `resubscribed` event.
        `buffer` bounds the messages waiting for a slow consumer (not for ``lossless``, which
        herald bounds by `window`); past it the client stops reading and herald's policy acts.
        """
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, not {type(pattern).__name__}")
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"policy must be one of {sorted(POLICIES)}, not {policy!r}")
        options: dict[str, Any] = {}
        if snapshot:
            options["snapshot"] = True
        if policy is not None:
            options["policy"] = policy
        if max_rate is not None:
            options["max_rate"] = max_rate
        if window is not None:
            options["window"] = window
        if window_bytes is not None:
            options["window_bytes"] = window_bytes
        positions = {t: Position(*p) for t, p in (since or {}).items()}
        self._check_usable()
        sub = Subscription(
            self, pattern, options, positions, self._buffer if buffer is None else buffer, handler, on_gap
        )
        self._patterns.setdefault(pattern, []).append(sub)
        self._routes.clear()
        if handler is not None:
            sub._task = self._spawn(sub._run_handler(handler))
        # While not open, the next connection subscribes every held pattern.
        if self.state == "open":
            self._send_subscribe(pattern, [sub], reconnected=False)
        try:
            await asyncio.wait_for(asyncio.shield(sub._ready), self._timeout)
        except asyncio.TimeoutError:
            self._drop_sub(sub)
            raise RequestTimeout(f"no reply to subscribing {pattern!r} within {self._timeout} s") from None
        return sub

    def _send_subscribe(self, pattern: str, subs: list[Subscription], reconnected: bool) -> None:
        """Sends one `sub` for `subs` (all on `pattern`): their options merged, `since` from
        their positions (the earliest per topic, so that each of them is filled), and the cursor
        of the oldest one's first reply."""
        body: dict[str, Any] = {"op": "sub", "topic": pattern}
        since: dict[str, Position] = {}
        for s in subs:
            body.update(s.options)
            for topic, pos in s.positions.items():
                have = since.get(topic)
                if have is None or (have.epoch == pos.epoch and pos.seq < have.seq):
                    since[topic] = pos
        if since:
            body["since"] = {t: {"seq": p.seq, "epoch": p.epoch} for t, p in since.items()}
        cursor = next((s.cursor for s in subs if s.cursor is not None), None)
        if cursor is not None:
            body["cursor"] = cursor
        group = list(subs)

        def on_reply(reply: dict[str, Any]) -> None:
            self._subscribed(pattern, group, reply, reconnected)

        fut, sent = self._send_request(body, on_reply=on_reply)
        fut.add_done_callback(lambda f: self._sub_failed(pattern, group, f))
        self._spawn(self._send_quietly(sent))

    async def _send_quietly(self, sent: Awaitable[None]) -> None:
        # A send that fails because the connection closed is retried by the resubscribe.
        with contextlib.suppress(NotConnected):
            await sent

    def _subscribed(self, pattern: str, subs: list[Subscription], reply: dict[str, Any], reconnected: bool) -> None:
        """herald's reply, handled before the next frame is read: the replayed messages that
        follow it must find any gap report already queued ahead of them."""
        r = Subscribed.from_wire(reply)
        self._replayed_to_come += r.replayed
        for s in subs:
            if not s.active:
                continue
            if s.subscribed is None:
                s.subscribed = r  # the first reply: its cursor is kept for the subscription's life
            if r.recovered is False:
                s._inbox.push(GapError(r))
            if not s._ready.done():
                s._ready.set_result(r)
        if reconnected:
            self._emit("resubscribed", Resubscribed(pattern, r.recovered is not False, r.replayed, r.gaps))

    def _sub_failed(self, pattern: str, subs: list[Subscription], fut: asyncio.Future[dict[str, Any]]) -> None:
        if fut.cancelled() or fut.exception() is None:
            return
        error = fut.exception()
        assert isinstance(error, HeraldError)
        # herald refused the pattern (invalid, forbidden, too many): it will never deliver.
        for s in subs:
            if not s._ready.done():
                s._ready.set_exception(error)
                s._ready.exception()  # retrieved: subscribe() may have stopped waiting for it
            self._drop_sub(s, error)
        self._emit_error(error)

    def _drop_sub(self, sub: Subscription, error: HeraldError | None = None) -> bool:
        """Forgets `sub`; True when it was the last one on its pattern."""
        sub._end(error)
        subs = self._patterns.get(sub.pattern)
        if subs is None or sub not in subs:
            return False
        subs.remove(sub)
        self._routes.clear()
        if subs:
            return False
        del self._patterns[sub.pattern]
        self._credits.pop(sub.pattern, None)
        return True

    async def _unsubscribe(self, sub: Subscription) -> None:
        last = self._drop_sub(sub)
        if sub._task is not None:
            sub._task.cancel()
        if last and self.state == "open":
            await self._request({"op": "unsub", "topic": sub.pattern})

    # ----------------------------------------------------------------------------------------
    # Receiving

    def _receive(self, ws: Connection, raw: str | bytes | bytearray) -> None:
        """One message from herald, handled as the connection parses it (_connection.py)."""
        try:
            self._dispatch(ws, raw)
        except Exception as e:  # a bug here must not leave the client silently deaf
            log.exception("the reader failed")
            self._fatal = HeraldError(f"the client's reader failed: {e!r}", "client_bug")
            self._spawn(ws.close(1011, "client error"))

    def _dispatch(self, ws: Connection, raw: str | bytes | bytearray) -> None:
        frame: bytes | bytearray = b""
        offset = 0
        try:
            if isinstance(raw, str):
                head = decode_head(raw)
            else:
                frame = raw
                head, offset = decode_frame(frame)
        except ValueError as e:
            self._emit_error(HeraldError(f"herald sent a frame the client cannot read: {e}", "bad_frame"))
            return
        op = head.get("op")
        if op == "msg":
            replayed = self._replayed_to_come > 0
            if replayed:
                self._replayed_to_come -= 1
            m = Message(head, str(head.get("data", "")) if isinstance(raw, str) else None, frame, offset)
            if self._dropped:
                m.dropped = self._dropped.pop(m.topic, 0)
            self._deliver(m, replayed, ws)
        elif op == "snapshot":
            # More of a large snapshot, served after the reply: the next `count` messages.
            self._replayed_to_come += int(head.get("count") or 0)
        elif op == "dropped":
            topic, count = str(head.get("topic")), int(head.get("count") or 0)
            self._dropped[topic] = self._dropped.get(topic, 0) + count
            self._emit("dropped", Dropped(topic, count, head.get("reason")))
        elif op == "error":
            err = server_error(str(head.get("code")), str(head.get("message")))
            pending = self._pending.pop(head["id"], None) if isinstance(head.get("id"), int) else None
            if pending is not None and not pending[0].done():
                pending[0].set_exception(err)
            else:
                self._last_error = err
                self._emit_error(err)
        else:
            pending = self._pending.pop(head["id"], None) if isinstance(head.get("id"), int) else None
            if pending is not None:
                fut, on_reply = pending
                if on_reply is not None:
                    on_reply(head)
                if not fut.done():
                    fut.set_result(head)

    def _deliver(self, m: Message, replayed: bool, ws: Connection) -> None:
        """Hands `m` to every matching subscription that has not seen it yet. A live message
        spent one credit of one lossless pattern at herald (the first the connection subscribed
        to that matches it); it is granted back once every lossless subscription of that pattern
        handled the message. Replayed messages spent none and earn none. An inbox this fills
        stops the reading of the socket until it has room again."""
        routes = self._routes.get(m.topic)
        if routes is None:
            routes = self._route(m.topic)
        ticket: _Ticket | None = None
        for route in routes:
            charges = not replayed and ticket is None and route.lossless
            if charges:
                ticket = _Ticket(route.pattern, m.size if route.byte_window else 0, ws, route.batch)
            for sub in route.subs:
                if not sub.active or not sub.accept(m):
                    continue
                mine = ticket if charges and sub.lossless else None
                if mine is not None:
                    mine.pending += 1
                inbox = sub._inbox
                inbox.push((m, mine))
                if inbox.full():
                    inbox.crowded = True
                    self._crowded.add(inbox)
                    ws.transport.pause_reading()
        if ticket is not None and ticket.pending == 0:
            self._handled(ticket, idle=True, done=True)

    def _route(self, topic: str) -> list[_Route]:
        if len(self._routes) >= _ROUTES:
            self._routes.clear()
        routes = [_Route(p, subs) for p, subs in self._patterns.items() if topic_matches(p, topic)]
        self._routes[topic] = routes
        return routes

    def _has_room(self, inbox: _Inbox) -> None:
        self._crowded.discard(inbox)
        if not self._crowded and self._ws is not None:
            self._ws.transport.resume_reading()

    def _handled(self, ticket: _Ticket, idle: bool, done: bool = False) -> None:
        """A subscription handled the message `ticket` came with (`idle`: it has no other one
        waiting). Once every subscription did, its credit is owed: granted at once when the
        subscriber has caught up or half the window is owed, else with whatever else is earned
        before the event loop turns (one `credit` for a consumer working through a backlog)."""
        if not done:
            ticket.pending -= 1
            if ticket.pending > 0:
                return
        if ticket.ws is not self._ws or ticket.pattern not in self._patterns:
            return  # a new connection's subscription started with a fresh window
        owed = self._credits.get(ticket.pattern)
        if owed is None:
            owed = self._credits[ticket.pattern] = [0, 0]
        owed[0] += 1
        owed[1] += ticket.bytes
        if idle or owed[0] >= ticket.batch[0] or owed[1] >= ticket.batch[1]:
            self._grant()
        elif not self._grant_soon:
            self._grant_soon = True
            asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        """Writes the credit owed, one `credit` per pattern; while a large message is being
        written on the connection, a task sends it after that."""
        self._grant_soon = False
        ws = self._ws
        if ws is None or self._credit_flush is not None:
            return
        credits = self._credits
        while credits:
            pattern, (n, nbytes) = next(iter(credits.items()))
            try:
                if not ws.write_now(_credit(pattern, n, nbytes), text=True):
                    self._credit_flush = self._spawn(self._flush_credits(ws))
                    return
            except NotConnected:
                return  # the resubscription after the reconnect brings a fresh window
            del credits[pattern]

    async def _flush_credits(self, ws: Connection) -> None:
        """Sends the credits owed, one `credit` per pattern for all that were earned meanwhile."""
        try:
            while self._credits and ws is self._ws:
                pattern, (n, nbytes) = next(iter(self._credits.items()))
                del self._credits[pattern]
                await ws.send_message(_credit(pattern, n, nbytes), text=True)
        except (NotConnected, ConnectionClosed, OSError):
            pass  # the resubscription after the reconnect brings a fresh window
        finally:
            self._credit_flush = None


# How many topics' routes are kept (past it they are found again).
_ROUTES = 4096

# herald's default lossless window (docs/protocol.md), and a bound never reached.
_DEFAULT_WINDOW = 16
_UNBOUNDED = 1 << 62


def _credit_batch(subs: list[Subscription]) -> tuple[int, int]:
    """How many handled messages, and payload bytes, may be owed on a lossless pattern before
    they are granted whatever follows: half its window (the subscriptions' options, merged as
    `sub` sends them), at least one."""
    window = window_bytes = None
    for s in subs:
        window = s.options.get("window", window)
        window_bytes = s.options.get("window_bytes", window_bytes)
    if window is None:
        window = _UNBOUNDED if window_bytes is not None else _DEFAULT_WINDOW
    return max(1, int(window) // 2), max(1, int(window_bytes) // 2) if window_bytes is not None else _UNBOUNDED


@functools.lru_cache(maxsize=1024)
def _credit_head(pattern: str) -> bytes:
    return b'{"op":"credit","topic":' + json.dumps(pattern).encode() + b',"n":'


def _credit(pattern: str, n: int, nbytes: int) -> bytes:
    """A `credit` message granting `n` messages and `nbytes` payload bytes (when not 0)."""
    return _credit_head(pattern) + (b'%d,"bytes":%d}' % (n, nbytes) if nbytes else b"%d}" % n)


def _time_out(reply: asyncio.Future[dict[str, Any]], op: str, timeout: float) -> None:
    if not reply.done():
        reply.set_exception(RequestTimeout(f"no reply to {op} within {timeout} s"))


def _jwt_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT, read without verifying it (herald verifies; the client only
    needs to know when to refresh), or None when the token is not a JWT carrying one."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, (int, float)) else None
    except (IndexError, ValueError, AttributeError):
        return None


class _Connect:
    """What `connect()` returns: ``await`` it for a `Client`, or use it as ``async with``."""

    def __init__(self, url: str, kwargs: dict[str, Any]) -> None:
        self._url = url
        self._kwargs = kwargs
        self._client: Client | None = None

    async def _make(self) -> Client:
        client = Client(self._url, **self._kwargs)
        await client._start()
        return client

    def __await__(self) -> Generator[Any, None, Client]:
        return self._make().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._make()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()


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
) -> _Connect:
    """Connects to herald at `url` (``ws://host:port/ws`` or ``wss://``). The first connection
    must succeed (else `NotConnected`, `Unauthorized`, ...); after that the client reconnects
    with exponential backoff and jitter (`min_delay` to `max_delay` seconds) until closed.

    `token`: a JWT, or a function (sync or async) asked for one before every connection and
    before the current one expires (`refresh_before` seconds ahead); sent as an
    ``Authorization`` header (`token_in="header"`), ``?token=`` or a first ``auth`` message.
    `request_timeout` bounds every wait for a reply. `buffer` is the default bound of messages
    waiting in a subscription for a slow consumer.
    """
    return _Connect(
        url,
        {
            "token": token,
            "token_in": token_in,
            "reconnect": reconnect,
            "min_delay": min_delay,
            "max_delay": max_delay,
            "request_timeout": request_timeout,
            "refresh_before": refresh_before,
            "buffer": buffer,
        },
    )
