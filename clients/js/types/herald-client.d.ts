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
 * @property {"history_trimmed" | "epoch_changed" | "unknown_topic" | "recovery_limit"} reason
 *   `recovery_limit`: messages `from`..`to` are held but were not replayed, the recovery being
 *   larger than herald's `max_recovery_bytes` for the connection (the newest were sent).
 * @property {number} [from]
 * @property {number} [to]
 * @property {string} [epoch]
 *
 * @typedef {object} Subscribed  The server's reply to a subscribe.
 * @property {string} topic  The pattern.
 * @property {boolean} [recovered]  Present when the subscribe asked for recovery (`since`, or
 *   the subscription's cursor after a reconnect): nothing published since is missing.
 * @property {number} [replayed]
 * @property {Gap[]} [gaps]
 * @property {string} [cursor]  herald's position when the subscription took effect (opaque).
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
 *   resolves with the {@link Ack}, `{topic, seq}`. `false` sends and resolves with undefined
 *   as soon as the message is handed to the socket.
 * @property {AbortSignal} [signal]  Gives up (rejecting with `aborted`) when it aborts: while
 *   waiting for the connection, or for herald's acknowledgement.
 *
 * @typedef {PublishOptions & {ack: false}} PublishOptionsNoAck
 * @typedef {PublishOptions & {ack?: true}} PublishOptionsAck
 *
 * @typedef {object} RequestOptions
 * @property {AbortSignal} [signal]  Gives up (rejecting with `aborted`) when it aborts.
 *
 * @typedef {object} Ack  herald's acknowledgement of a publish.
 * @property {string} topic
 * @property {number} seq  The message's sequence number in its topic.
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
 * @property {number} [requestTimeoutMs]  Reject a request (publish, ping, unsubscribe) with
 *   `timeout` when herald has not replied this long after the call (default 10000). Waiting
 *   for the connection counts: a publish while herald cannot be reached fails after this too.
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
 * @property {boolean} recovered  herald's own verdict: true only when herald reported that
 *   nothing published while the client was away is missing (every topic it had seen, and every
 *   topic first published meanwhile, replayed from history). False when herald reported a gap,
 *   or did not say (a herald without subscription cursors).
 * @property {number} replayed  Messages herald replayed.
 * @property {Gap[]} gaps  What herald could not replay, exactly as herald reported it.
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
export class HeraldClient {
    /**
     * @param {string | URL} url
     * @param {ConnectOptions} [options]
     */
    constructor(url: string | URL, options?: ConnectOptions);
    /** The URL connected to. */
    url: string;
    /** The connection's state; `state` events report its changes. @type {ConnectionState} */
    state: ConnectionState;
    /**
     * Listens to `state` changes, `dropped` notices, `error`s no request was waiting for, and
     * `resubscribed` reports after a reconnect. Returns a function that removes the listener.
     * @template {keyof ClientEvents} K
     * @param {K} event
     * @param {(e: ClientEvents[K]) => void} listener
     * @returns {() => void}
     */
    on<K extends keyof ClientEvents>(event: K, listener: (e: ClientEvents[K]) => void): () => void;
    /**
     * Like `on`, for the next event only.
     * @template {keyof ClientEvents} K
     * @param {K} event
     * @param {(e: ClientEvents[K]) => void} listener
     * @returns {() => void}
     */
    once<K extends keyof ClientEvents>(event: K, listener: (e: ClientEvents[K]) => void): () => void;
    /**
     * Removes a listener added with `on` or `once`.
     * @template {keyof ClientEvents} K
     * @param {K} event
     * @param {(e: ClientEvents[K]) => void} listener
     */
    off<K extends keyof ClientEvents>(event: K, listener: (e: ClientEvents[K]) => void): void;
    /** Closes the connection for good: no reconnect; pending requests fail with `closed`. */
    close(): void;
    /**
     * Resolves when the connection is open (without a time limit; rejects once closed).
     * @returns {Promise<void>}
     */
    whenOpen(): Promise<void>;
    /**
     * Subscribes `handler` to `pattern` (wildcards `*` and `>`). Delivery starts after herald's
     * reply (`subscription.ready`). After a reconnect the subscription is renewed with `since`
     * set to the last position it saw of every topic and with the cursor of herald's first reply,
     * so that herald replays what it missed, topics first published meanwhile included; a
     * `resubscribed` event carries herald's verdict.
     * @param {string} pattern
     * @param {Handler} handler
     * @param {SubscribeOptions} [options]
     * @returns {Subscription}
     */
    subscribe(pattern: string, handler: Handler, options?: SubscribeOptions): Subscription;
    /**
     * Removes a subscription; herald is told when it was the last one on its pattern.
     * @param {Subscription} subscription
     * @param {RequestOptions} [options]
     * @returns {Promise<void>}
     */
    unsubscribe(subscription: Subscription, options?: RequestOptions): Promise<void>;
    /**
     * Publishes to an exact topic. Strings travel as text; ArrayBuffer, typed arrays and Blobs as
     * a binary frame (never base64); any other value as JSON text (`ct` application/json).
     * Resolves with herald's acknowledgement, `{topic, seq}`, or with undefined for
     * `{ack: false}`; rejects with herald's error (`HeraldError`), `bad_argument` for a topic or
     * value that cannot be sent, `timeout` after `requestTimeoutMs`, `aborted` when `signal` aborts.
     * @overload
     * @param {string} topic
     * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
     * @param {PublishOptionsNoAck} options
     * @returns {Promise<undefined>}
     */
    publish(topic: string, data: string | ArrayBuffer | ArrayBufferView | Blob | any, options: PublishOptionsNoAck): Promise<undefined>;
    /**
     * @overload
     * @param {string} topic
     * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
     * @param {PublishOptionsAck} [options]
     * @returns {Promise<Ack>}
     */
    publish(topic: string, data: string | ArrayBuffer | ArrayBufferView | Blob | any, options?: PublishOptionsAck | undefined): Promise<Ack>;
    /**
     * @overload
     * @param {string} topic
     * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
     * @param {PublishOptions} [options]
     * @returns {Promise<Ack | undefined>}
     */
    publish(topic: string, data: string | ArrayBuffer | ArrayBufferView | Blob | any, options?: PublishOptions | undefined): Promise<Ack | undefined>;
    /**
     * An application-level round trip to herald, within `requestTimeoutMs`.
     * @param {RequestOptions} [options]
     */
    ping(options?: RequestOptions): Promise<void>;
    #private;
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
    /**
     *  `recovery_limit`: messages `from`..`to` are held but were not replayed, the recovery being
     *  larger than herald's `max_recovery_bytes` for the connection (the newest were sent).
     */
    reason: "history_trimmed" | "epoch_changed" | "unknown_topic" | "recovery_limit";
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
     * Present when the subscribe asked for recovery (`since`, or
     * the subscription's cursor after a reconnect): nothing published since is missing.
     */
    recovered?: boolean | undefined;
    replayed?: number | undefined;
    gaps?: Gap[] | undefined;
    /**
     * herald's position when the subscription took effect (opaque).
     */
    cursor?: string | undefined;
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
     * resolves with the {@link Ack}, `{topic, seq}`. `false` sends and resolves with undefined
     * as soon as the message is handed to the socket.
     */
    ack?: boolean | undefined;
    /**
     * Gives up (rejecting with `aborted`) when it aborts: while
     * waiting for the connection, or for herald's acknowledgement.
     */
    signal?: AbortSignal | undefined;
};
export type PublishOptionsNoAck = PublishOptions & {
    ack: false;
};
export type PublishOptionsAck = PublishOptions & {
    ack?: true;
};
export type RequestOptions = {
    /**
     * Gives up (rejecting with `aborted`) when it aborts.
     */
    signal?: AbortSignal | undefined;
};
/**
 * herald's acknowledgement of a publish.
 */
export type Ack = {
    topic: string;
    /**
     * The message's sequence number in its topic.
     */
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
     * Reject a request (publish, ping, unsubscribe) with
     * `timeout` when herald has not replied this long after the call (default 10000). Waiting
     * for the connection counts: a publish while herald cannot be reached fails after this too.
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
     * herald's own verdict: true only when herald reported that
     * nothing published while the client was away is missing (every topic it had seen, and every
     * topic first published meanwhile, replayed from history). False when herald reported a gap,
     * or did not say (a herald without subscription cursors).
     */
    recovered: boolean;
    /**
     * Messages herald replayed.
     */
    replayed: number;
    /**
     * What herald could not replay, exactly as herald reported it.
     */
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
/**
 * One `subscribe` call. Several may share a pattern; herald holds the pattern once.
 */
export type Subscription = {
    pattern: string;
    /**
     * Settles with herald's first `subscribed` reply, or
     * rejects with its error (also an `error` event), or with `closed` when the client closes
     * first.
     */
    ready: Promise<Subscribed>;
    /**
     * Stops delivery to this handler (and
     * unsubscribes at herald if it was the pattern's last).
     */
    unsubscribe: () => Promise<void>;
};
import { topicMatches } from "./topic.js";
