/**
 * The binary frame layout of docs/protocol.md: 4-byte big-endian header length, the JSON header,
 * the payload.
 * @param {object} head
 * @param {Uint8Array} payload
 */
export function encodeBinaryFrame(head: object, payload: Uint8Array): Uint8Array<ArrayBuffer>;
/**
 * Splits a binary frame into its JSON header and payload (a view, not a copy).
 * @param {ArrayBuffer} buf
 * @returns {[Record<string, any>, Uint8Array]}
 */
export function decodeBinaryFrame(buf: ArrayBuffer): [Record<string, any>, Uint8Array];
/**
 * Opens a client. It connects at once and keeps reconnecting until `close()`; requests made
 * before the connection is open wait for it.
 * @param {string | URL} url  e.g. `ws://localhost:8080/ws`
 * @param {ConnectOptions} [options]
 */
export function connect(url: string | URL, options?: ConnectOptions): HeraldClient;
export { topicMatches };
/**
 * @typedef {"connecting" | "open" | "reconnecting" | "closed"} ConnectionState
 *
 * @typedef {object} Position  The last message seen of one topic.
 * @property {number} seq
 * @property {string} epoch
 *
 * @typedef {object} Gap  What a resubscription could not recover (docs/protocol.md).
 * @property {string} topic
 * @property {"history_trimmed" | "epoch_changed" | "unknown_topic"} reason
 * @property {number} [from]
 * @property {number} [to]
 * @property {string} [epoch]
 *
 * @typedef {object} Subscribed  The server's reply to a subscribe.
 * @property {string} topic  The pattern.
 * @property {boolean} [recovered]  Present when `since` was sent: every position was filled.
 * @property {number} [replayed]
 * @property {Gap[]} [gaps]
 *
 * @typedef {"disconnect" | "drop" | "conflate" | "lossless"} Policy
 *
 * @typedef {object} SubscribeOptions
 * @property {boolean} [snapshot]  First deliver the last value of every matching topic.
 * @property {Record<string, Position>} [since]  Replay what followed these positions.
 * @property {Policy} [policy]  What herald does when this subscriber falls behind.
 * @property {number} [maxRate]  `conflate`: at most this many messages per second per topic.
 * @property {number} [window]  `lossless`: messages granted before the first credit.
 * @property {number} [windowBytes]  `lossless`: payload bytes granted before the first credit
 *   (a byte window; each handled message grants its payload size back).
 *
 * @typedef {object} PublishOptions
 * @property {string} [ct]  Content type; defaults to `application/json` for JSON values and to a
 *   Blob's type for Blobs.
 * @property {boolean} [stamp]  Ask herald to add its receive time `ts` (µs since the UNIX epoch).
 * @property {boolean} [ack]  Wait for herald's acknowledgement (default true): the promise
 *   resolves with the sequence number. `false` sends and resolves at once.
 *
 * @typedef {object} Ack
 * @property {string} topic
 * @property {number} seq
 *
 * @typedef {(() => string | Promise<string>)} TokenSource
 *
 * @typedef {object} ConnectOptions
 * @property {{new (url: string | URL, protocols?: string | string[]): WebSocket}} [WebSocket]
 *   The WebSocket constructor; defaults to the platform's `globalThis.WebSocket` (Node 20 needs
 *   `--experimental-websocket`, or pass the `ws` package's constructor).
 * @property {string | TokenSource} [token]  A token, or a function asked for a fresh one before
 *   every (re)connect and before the current one expires.
 * @property {"query" | "message"} [tokenIn]  Send the token as `?token=` on the URL (default) or
 *   as a first `{"op":"auth"}` message.
 * @property {number} [refreshBeforeSecs]  Refresh the token this long before the `exp` herald
 *   reported (default 30).
 * @property {boolean} [reconnect]  Reconnect after an unexpected close (default true).
 * @property {number} [minDelayMs]  First reconnect delay (default 250).
 * @property {number} [maxDelayMs]  Largest reconnect delay (default 10000).
 * @property {number} [requestTimeoutMs]  Reject a request without a reply after this (default 10000).
 *
 * @typedef {object} DroppedEvent  herald dropped messages of `topic` for this connection.
 * @property {string} topic
 * @property {number} count
 * @property {string} [reason]
 *
 * @typedef {object} StateEvent
 * @property {ConnectionState} state
 * @property {number} [attempt]  Reconnect attempt (1 = the first retry).
 * @property {number} [delayMs]  Wait before this attempt.
 * @property {number} [code]  Close code of the connection that ended.
 * @property {string} [reason]  Close reason of the connection that ended.
 *
 * @typedef {object} ResubscribedEvent  A subscription was re-established after a reconnect.
 * @property {string} pattern
 * @property {boolean} recovered  Nothing was missed: every gap was filled from herald's history.
 * @property {number} replayed
 * @property {Gap[]} gaps
 *
 * @typedef {{
 *   state: StateEvent,
 *   dropped: DroppedEvent,
 *   error: HeraldError,
 *   resubscribed: ResubscribedEvent,
 * }} ClientEvents
 */
/** An error herald reported (`code` as in docs/protocol.md) or one of the client's own. */
export class HeraldError extends Error {
    /**
     * @param {string} code  e.g. `invalid_topic`, `not_connected`, `timeout`, `closed`.
     * @param {string} message
     */
    constructor(code: string, message: string);
    code: string;
}
/** One message delivered to a subscription handler. */
export class Message {
    /**
     * @param {Record<string, any>} head  The frame's JSON (text) or binary header.
     * @param {string | Uint8Array} data
     */
    constructor(head: Record<string, any>, data: string | Uint8Array);
    /** @type {string} */
    topic: string;
    /** @type {number} */
    seq: number;
    /** @type {string} */
    epoch: string;
    /** @type {string | undefined} */
    ct: string | undefined;
    /** herald's receive time, µs since the UNIX epoch, when the publisher asked for `stamp`.
     * @type {number | undefined} */
    ts: number | undefined;
    /** A string for text messages, the raw bytes for binary ones. @type {string | Uint8Array} */
    data: string | Uint8Array;
    /** The payload parsed as JSON (text or UTF-8 bytes). @returns {any} */
    json(): any;
    /** The payload as a string (binary payloads decoded as UTF-8). @returns {string} */
    text(): string;
}
/**
 * A handler may return a promise: for `lossless` subscriptions the credit for a message is sent
 * only once it settles, and the next message waits for it.
 * @typedef {(message: Message) => void | Promise<void>} Handler
 */
/** One `subscribe` call. Several may share a pattern; herald holds the pattern once. */
export class Subscription {
    /**
     * @param {HeraldClient} client
     * @param {string} pattern
     * @param {Handler} handler
     * @param {SubscribeOptions} options
     */
    constructor(client: HeraldClient, pattern: string, handler: Handler, options: SubscribeOptions);
    client: HeraldClient;
    pattern: string;
    handler: Handler;
    options: SubscribeOptions;
    /** The last position this subscription saw per topic: the `since` of a resubscribe.
     * @type {Map<string, Position>} */
    positions: Map<string, Position>;
    /** Serialises handlers that return promises, so messages stay in order. */
    tail: Promise<void>;
    active: boolean;
    /** @type {(r: Subscribed) => void} */
    resolveReady: (r: Subscribed) => void;
    /** @type {(e: HeraldError) => void} */
    rejectReady: (e: HeraldError) => void;
    /** Settles with herald's first `subscribed` reply (or its error). @type {Promise<Subscribed>} */
    ready: Promise<Subscribed>;
    /** Stops delivery to this handler (and unsubscribes at herald if it was the pattern's last). */
    unsubscribe(): Promise<void>;
    /**
     * Whether this subscription should see `head` (a message of a topic it matches): drops what
     * it already saw (a snapshot or replay may repeat a message), accepts a new epoch.
     * @param {Message} m
     */
    accept(m: Message): boolean;
}
export class HeraldClient {
    /**
     * @param {string | URL} url
     * @param {ConnectOptions} [options]
     */
    constructor(url: string | URL, options?: ConnectOptions);
    url: string;
    WebSocket: new (url: string | URL, protocols?: string | string[]) => WebSocket;
    options: {
        /**
         * The WebSocket constructor; defaults to the platform's `globalThis.WebSocket` (Node 20 needs
         * `--experimental-websocket`, or pass the `ws` package's constructor).
         */
        WebSocket?: (new (url: string | URL, protocols?: string | string[]) => WebSocket) | undefined;
        /**
         * A token, or a function asked for a fresh one before
         * every (re)connect and before the current one expires.
         */
        token?: string | TokenSource | undefined;
        /**
         * Send the token as `?token=` on the URL (default) or
         * as a first `{"op":"auth"}` message.
         */
        tokenIn: string;
        /**
         * Refresh the token this long before the `exp` herald
         * reported (default 30).
         */
        refreshBeforeSecs: number;
        /**
         * Reconnect after an unexpected close (default true).
         */
        reconnect: boolean;
        /**
         * First reconnect delay (default 250).
         */
        minDelayMs: number;
        /**
         * Largest reconnect delay (default 10000).
         */
        maxDelayMs: number;
        /**
         * Reject a request without a reply after this (default 10000).
         */
        requestTimeoutMs: number;
    };
    /** @type {ConnectionState} */
    state: ConnectionState;
    /** @type {WebSocket | null} */
    ws: WebSocket | null;
    nextId: number;
    attempt: number;
    everOpened: boolean;
    /** @type {Map<number, {resolve: (v: any) => void, reject: (e: HeraldError) => void, timer: any, resend?: boolean}>} */
    pending: Map<number, {
        resolve: (v: any) => void;
        reject: (e: HeraldError) => void;
        timer: any;
        resend?: boolean;
    }>;
    /** Subscriptions by pattern. @type {Map<string, Set<Subscription>>} */
    patterns: Map<string, Set<Subscription>>;
    /** Lossless credits waiting to be sent, by pattern: messages and payload bytes.
     * @type {Map<string, {n: number, bytes: number}>} */
    credits: Map<string, {
        n: number;
        bytes: number;
    }>;
    /** Message frames still to come that herald announced as replayed (snapshot or `since`) in
     * a `subscribed` reply: they spent no lossless credit, so none is granted back for them. */
    replayedToCome: number;
    /** Listeners by event name (typed at `on`). @type {Map<string, Set<(e: any) => void>>} */
    listeners: Map<string, Set<(e: any) => void>>;
    /** Requests waiting for the connection. @type {Array<{resolve: () => void, reject: (e: HeraldError) => void}>} */
    waitingForOpen: Array<{
        resolve: () => void;
        reject: (e: HeraldError) => void;
    }>;
    /** @type {any} */
    retryTimer: any;
    /** @type {any} */
    refreshTimer: any;
    /**
     * Listens to `state` changes, `dropped` notices, `error`s no request was waiting for, and
     * `resubscribed` reports after a reconnect. Returns a function that removes the listener.
     * @template {keyof ClientEvents} K
     * @param {K} event
     * @param {(e: ClientEvents[K]) => void} listener
     */
    on<K extends keyof ClientEvents>(event: K, listener: (e: ClientEvents[K]) => void): () => boolean;
    /**
     * @template {keyof ClientEvents} K
     * @param {K} event
     * @param {ClientEvents[K]} detail
     */
    emit<K extends keyof ClientEvents>(event: K, detail: ClientEvents[K]): void;
    /** @param {ConnectionState} state @param {Omit<StateEvent, "state">} [extra] */
    setState(state: ConnectionState, extra?: Omit<StateEvent, "state">): void;
    token(): Promise<string | undefined>;
    open(): Promise<void>;
    /** @param {WebSocket} ws @param {string | undefined} token */
    opened(ws: WebSocket, token: string | undefined): void;
    /**
     * Re-authenticates on the live connection before the token expires: `refreshBeforeSecs`
     * before `exp`, but never in the first half of the time left, so that a token living less
     * than `refreshBeforeSecs` is refreshed once per half-life rather than in a tight loop.
     * @param {number | undefined} exp  Unix seconds (from `authed`, or the token's own claim).
     */
    scheduleRefresh(exp: number | undefined): void;
    /** @param {WebSocket} ws @param {number} code @param {string} reason */
    closed(ws: WebSocket, code: number, reason: string): void;
    /** @param {number | undefined} code @param {string | undefined} reason */
    scheduleReconnect(code: number | undefined, reason: string | undefined): void;
    failWaiting(): void;
    /** Closes the connection for good: no reconnect; pending requests fail with `closed`. */
    close(): void;
    /** Resolves when the connection is open. */
    whenOpen(): Promise<any>;
    /**
     * Sends a request with a fresh id and resolves with herald's reply (rejects with its error).
     * @param {Record<string, any>} body
     * @param {{binary?: Uint8Array, resend?: boolean}} [extra]
     * @returns {Promise<any>}
     */
    request(body: Record<string, any>, extra?: {
        binary?: Uint8Array;
        resend?: boolean;
    }): Promise<any>;
    /** @param {Record<string, any>} body @param {Uint8Array} [binary] */
    send(body: Record<string, any>, binary?: Uint8Array): void;
    /**
     * Subscribes `handler` to `pattern` (wildcards `*` and `>`). Delivery starts after herald's
     * reply (`subscription.ready`). After a reconnect the subscription is renewed with `since` set
     * to the last position it saw of every topic, and a `resubscribed` event says whether anything
     * was lost.
     * @param {string} pattern
     * @param {Handler} handler
     * @param {SubscribeOptions} [options]
     */
    subscribe(pattern: string, handler: Handler, options?: SubscribeOptions): Subscription;
    /**
     * Sends one `sub` for `subs` (all on `pattern`): the union of their options, `since` from
     * their positions (the earliest per topic, so that every one of them is filled).
     * @param {string} pattern
     * @param {Set<Subscription>} subs
     * @param {boolean} reconnected  Report the outcome as a `resubscribed` event.
     */
    sendSubscribe(pattern: string, subs: Set<Subscription>, reconnected: boolean): void;
    /**
     * Removes a subscription; herald is told when it was the last one on its pattern.
     * @param {Subscription} sub
     * @returns {Promise<void>}
     */
    unsubscribe(sub: Subscription): Promise<void>;
    /**
     * Publishes to an exact topic. Strings travel as text; ArrayBuffer, typed arrays and Blobs as
     * a binary frame (never base64); any other value as JSON text (`ct` application/json).
     * @param {string} topic
     * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
     * @param {PublishOptions} [options]
     * @returns {Promise<Ack | undefined>}  The acknowledgement (undefined with `ack: false`).
     */
    publish(topic: string, data: string | ArrayBuffer | ArrayBufferView | Blob | any, options?: PublishOptions): Promise<Ack | undefined>;
    /** An application-level round trip to herald. */
    ping(): Promise<void>;
    /** @param {string | ArrayBuffer} raw */
    receive(raw: string | ArrayBuffer): void;
    /** @param {number} id */
    settle(id: number): void;
    /**
     * Hands a message to every matching subscription that has not seen it yet. Lossless handlers
     * run one message at a time per subscription. A live message spent one credit of one
     * subscription at herald (the first lossless pattern the connection subscribed to that
     * matches it, docs/protocol.md); that credit is granted back once, after every handler of
     * that pattern finished with the message. Replayed messages spent none and earn none.
     * @param {Message} m
     * @param {boolean} replayed  Part of a snapshot or `since` replay.
     * @param {string | Uint8Array} [body]  The payload as received (its size is the byte credit
     *   a byte window grants back).
     */
    deliver(m: Message, replayed: boolean, body?: string | Uint8Array): void;
    /** Runs a handler; its exceptions become `error` events rather than stopping delivery.
     * @param {Subscription} sub @param {Message} m */
    run(sub: Subscription, m: Message): Promise<void>;
    /**
     * Grants herald one more message (and its `bytes` of payload, with a byte window) on the
     * lossless subscription to `pattern`. Credits are batched: those earned in one turn of the
     * event loop go out as one `credit` request. A message that came on an earlier connection
     * earns nothing: a resubscription starts with a fresh window.
     * @param {string} pattern
     * @param {WebSocket | null} ws  The connection the message came on.
     * @param {number} bytes
     */
    credit(pattern: string, ws: WebSocket | null, bytes: number): void;
}
export type ConnectionState = "connecting" | "open" | "reconnecting" | "closed";
/**
 * The last message seen of one topic.
 */
export type Position = {
    seq: number;
    epoch: string;
};
/**
 * What a resubscription could not recover (docs/protocol.md).
 */
export type Gap = {
    topic: string;
    reason: "history_trimmed" | "epoch_changed" | "unknown_topic";
    from?: number | undefined;
    to?: number | undefined;
    epoch?: string | undefined;
};
/**
 * The server's reply to a subscribe.
 */
export type Subscribed = {
    /**
     * The pattern.
     */
    topic: string;
    /**
     * Present when `since` was sent: every position was filled.
     */
    recovered?: boolean | undefined;
    replayed?: number | undefined;
    gaps?: Gap[] | undefined;
};
export type Policy = "disconnect" | "drop" | "conflate" | "lossless";
export type SubscribeOptions = {
    /**
     * First deliver the last value of every matching topic.
     */
    snapshot?: boolean | undefined;
    /**
     * Replay what followed these positions.
     */
    since?: Record<string, Position> | undefined;
    /**
     * What herald does when this subscriber falls behind.
     */
    policy?: Policy | undefined;
    /**
     * `conflate`: at most this many messages per second per topic.
     */
    maxRate?: number | undefined;
    /**
     * `lossless`: messages granted before the first credit.
     */
    window?: number | undefined;
    /**
     * `lossless`: payload bytes granted before the first credit
     * (a byte window; each handled message grants its payload size back).
     */
    windowBytes?: number | undefined;
};
export type PublishOptions = {
    /**
     * Content type; defaults to `application/json` for JSON values and to a
     * Blob's type for Blobs.
     */
    ct?: string | undefined;
    /**
     * Ask herald to add its receive time `ts` (µs since the UNIX epoch).
     */
    stamp?: boolean | undefined;
    /**
     * Wait for herald's acknowledgement (default true): the promise
     * resolves with the sequence number. `false` sends and resolves at once.
     */
    ack?: boolean | undefined;
};
export type Ack = {
    topic: string;
    seq: number;
};
export type TokenSource = (() => string | Promise<string>);
export type ConnectOptions = {
    /**
     * The WebSocket constructor; defaults to the platform's `globalThis.WebSocket` (Node 20 needs
     * `--experimental-websocket`, or pass the `ws` package's constructor).
     */
    WebSocket?: (new (url: string | URL, protocols?: string | string[]) => WebSocket) | undefined;
    /**
     * A token, or a function asked for a fresh one before
     * every (re)connect and before the current one expires.
     */
    token?: string | TokenSource | undefined;
    /**
     * Send the token as `?token=` on the URL (default) or
     * as a first `{"op":"auth"}` message.
     */
    tokenIn?: "query" | "message" | undefined;
    /**
     * Refresh the token this long before the `exp` herald
     * reported (default 30).
     */
    refreshBeforeSecs?: number | undefined;
    /**
     * Reconnect after an unexpected close (default true).
     */
    reconnect?: boolean | undefined;
    /**
     * First reconnect delay (default 250).
     */
    minDelayMs?: number | undefined;
    /**
     * Largest reconnect delay (default 10000).
     */
    maxDelayMs?: number | undefined;
    /**
     * Reject a request without a reply after this (default 10000).
     */
    requestTimeoutMs?: number | undefined;
};
/**
 * herald dropped messages of `topic` for this connection.
 */
export type DroppedEvent = {
    topic: string;
    count: number;
    reason?: string | undefined;
};
export type StateEvent = {
    state: ConnectionState;
    /**
     * Reconnect attempt (1 = the first retry).
     */
    attempt?: number | undefined;
    /**
     * Wait before this attempt.
     */
    delayMs?: number | undefined;
    /**
     * Close code of the connection that ended.
     */
    code?: number | undefined;
    /**
     * Close reason of the connection that ended.
     */
    reason?: string | undefined;
};
/**
 * A subscription was re-established after a reconnect.
 */
export type ResubscribedEvent = {
    pattern: string;
    /**
     * Nothing was missed: every gap was filled from herald's history.
     */
    recovered: boolean;
    replayed: number;
    gaps: Gap[];
};
export type ClientEvents = {
    state: StateEvent;
    dropped: DroppedEvent;
    error: HeraldError;
    resubscribed: ResubscribedEvent;
};
/**
 * A handler may return a promise: for `lossless` subscriptions the credit for a message is sent
 * only once it settles, and the next message waits for it.
 */
export type Handler = (message: Message) => void | Promise<void>;
import { topicMatches } from "./topic.js";
