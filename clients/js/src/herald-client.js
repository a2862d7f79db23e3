// herald-client: a browser and Node (>= 20) client for herald's native protocol
// (docs/protocol.md). No runtime dependencies: it uses the platform WebSocket, TextEncoder and
// TextDecoder. It makes the delivery contract (docs/semantics.md) effortless to use: it remembers
// the last position seen per topic and subscription, reconnects with exponential backoff and
// jitter, resubscribes with `since` and the subscription's cursor, and reports herald's verdict
// on whether the gap was fully recovered.

import { topicMatches } from "./topic.js";

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
  constructor(code, message) {
    super(message);
    this.name = "HeraldError";
    this.code = code;
  }
}

/** One message delivered to a subscription handler. */
export class Message {
  /**
   * @param {Record<string, any>} head  The frame's JSON (text) or binary header.
   * @param {string | Uint8Array} data
   */
  constructor(head, data) {
    /** @type {string} */
    this.topic = head.topic;
    /** @type {number} */
    this.seq = head.seq;
    /** @type {string} */
    this.epoch = head.epoch;
    /** @type {string | undefined} */
    this.ct = head.ct;
    /** herald's receive time, µs since the UNIX epoch, when the publisher asked for `stamp`.
     * @type {number | undefined} */
    this.ts = head.ts;
    /** A string for text messages, the raw bytes for binary ones. @type {string | Uint8Array} */
    this.data = data;
  }

  /** The payload parsed as JSON (text or UTF-8 bytes). @returns {any} */
  json() {
    return JSON.parse(this.text());
  }

  /** The payload as a string (binary payloads decoded as UTF-8). @returns {string} */
  text() {
    return typeof this.data === "string" ? this.data : new TextDecoder().decode(this.data);
  }
}

/**
 * A handler may return a promise: for `lossless` subscriptions the credit for a message is sent
 * only once it settles, and the next message waits for it.
 * @typedef {(message: Message) => void | Promise<void>} Handler
 */

/**
 * One `subscribe` call. Several may share a pattern; herald holds the pattern once.
 * @typedef {object} Subscription
 * @property {string} pattern
 * @property {Promise<Subscribed>} ready  Settles with herald's first `subscribed` reply, or
 *   rejects with its error (also an `error` event), or with `closed` when the client closes
 *   first.
 * @property {() => Promise<void>} unsubscribe  Stops delivery to this handler (and
 *   unsubscribes at herald if it was the pattern's last).
 */

/** The client's side of a {@link Subscription}: what it saw, and where recovery starts. */
class Sub {
  /**
   * @param {HeraldClient} client
   * @param {string} pattern
   * @param {Handler} handler
   * @param {SubscribeOptions} options
   */
  constructor(client, pattern, handler, options) {
    this.client = client;
    this.pattern = pattern;
    this.handler = handler;
    this.options = options;
    /** The last position this subscription saw per topic: the `since` of a resubscribe.
     * @type {Map<string, Position>} */
    this.positions = new Map();
    for (const [topic, pos] of Object.entries(options.since ?? {})) this.positions.set(topic, pos);
    /** The cursor of herald's first `subscribed` reply: a resubscribe sends it, so that herald
     * also replays topics first published while the client was away. @type {string | undefined} */
    this.cursor = undefined;
    /** Serialises handlers that return promises, so messages stay in order. */
    this.tail = Promise.resolve();
    this.active = true;
    this.settled = false;
    /** @type {(r: Subscribed) => void} */
    this.resolveReady = () => {};
    /** @type {(e: HeraldError) => void} */
    this.rejectReady = () => {};
    /** @type {Promise<Subscribed>} */
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = (r) => {
        this.settled = true;
        resolve(r);
      };
      this.rejectReady = (e) => {
        this.settled = true;
        reject(e);
      };
    });
    this.ready.catch(() => {}); // callers need not await it; errors also go to `error` listeners
  }

  unsubscribe() {
    return this.client.unsubscribe(this);
  }

  /**
   * Whether this subscription should see `m` (a message of a topic it matches): drops what it
   * already saw (a snapshot or replay may repeat a message), accepts a new epoch.
   * @param {Message} m
   */
  accept(m) {
    const last = this.positions.get(m.topic);
    if (last && last.epoch === m.epoch && m.seq <= last.seq) return false;
    this.positions.set(m.topic, { seq: m.seq, epoch: m.epoch });
    return true;
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * The binary frame layout of docs/protocol.md: 4-byte big-endian header length, the JSON header,
 * the payload.
 * @param {object} head
 * @param {Uint8Array} payload
 */
export function encodeBinaryFrame(head, payload) {
  const h = encoder.encode(JSON.stringify(head));
  const frame = new Uint8Array(4 + h.length + payload.length);
  new DataView(frame.buffer).setUint32(0, h.length);
  frame.set(h, 4);
  frame.set(payload, 4 + h.length);
  return frame;
}

/**
 * Splits a binary frame into its JSON header and payload (a view, not a copy).
 * @param {ArrayBuffer} buf
 * @returns {[Record<string, any>, Uint8Array]}
 */
export function decodeBinaryFrame(buf) {
  if (buf.byteLength < 4) throw new HeraldError("bad_frame", "binary frame shorter than 4 bytes");
  const n = new DataView(buf).getUint32(0);
  if (4 + n > buf.byteLength) throw new HeraldError("bad_frame", "binary frame shorter than its header length");
  const head = JSON.parse(decoder.decode(new Uint8Array(buf, 4, n)));
  return [head, new Uint8Array(buf, 4 + n)];
}

/**
 * Opens a client. It connects at once and keeps reconnecting until `close()`; requests made
 * before the connection is open wait for it.
 * @param {string | URL} url  e.g. `ws://localhost:8080/ws`
 * @param {ConnectOptions} [options]
 */
export function connect(url, options = {}) {
  return new HeraldClient(url, options);
}

export class HeraldClient {
  /** @type {{new (url: string | URL, protocols?: string | string[]): WebSocket}} */
  #WebSocket;
  /** @type {Required<Omit<ConnectOptions, "WebSocket" | "token">> & Pick<ConnectOptions, "token">} */
  #options;
  /** @type {WebSocket | null} */
  #ws = null;
  /** Whether `#ws` has opened. */
  #wsOpen = false;
  #nextId = 1;
  #attempt = 0;
  #everOpened = false;
  /** Whether the URL was asked over HTTP why its WebSocket failed. */
  #probed = false;
  /** Requests waiting for herald's reply, by id. A `resend` one (a subscribe) outlives its
   * connection: the next connection sends it again.
   * @type {Map<number, {resolve: (v: any) => void, reject: (e: HeraldError) => void, resend: boolean}>} */
  #pending = new Map();
  /** Subscriptions by pattern. @type {Map<string, Set<Sub>>} */
  #patterns = new Map();
  /** Lossless credits waiting to be sent, by pattern: messages and payload bytes.
   * @type {Map<string, {n: number, bytes: number}>} */
  #credits = new Map();
  /** Message frames still to come that herald announced as replayed (snapshot or `since`) in
   * a `subscribed` reply, or as more of a snapshot in a `snapshot` notice: they spent no
   * lossless credit, so none is granted back for them. */
  #replayedToCome = 0;
  /** Listeners by event name, each with whether it was added by `once`.
   * @type {Map<string, Map<(e: any) => void, boolean>>} */
  #listeners = new Map();
  /** Requests waiting for the connection. @type {Array<{resolve: () => void, reject: (e: HeraldError) => void}>} */
  #waitingForOpen = [];
  /** @type {any} */
  #retryTimer = null;
  /** @type {any} */
  #refreshTimer = null;

  /**
   * @param {string | URL} url
   * @param {ConnectOptions} [options]
   */
  constructor(url, options = {}) {
    const WS = options.WebSocket ?? globalThis.WebSocket;
    if (!WS) {
      throw new HeraldError(
        "no_websocket",
        "no WebSocket constructor: run Node 20 with --experimental-websocket (Node 22+ has it), or pass { WebSocket } (e.g. the ws package)",
      );
    }
    /** The URL connected to. */
    this.url = String(url);
    this.#WebSocket = WS;
    this.#options = {
      tokenIn: "query",
      refreshBeforeSecs: 30,
      reconnect: true,
      minDelayMs: 250,
      maxDelayMs: 10_000,
      requestTimeoutMs: 10_000,
      ...options,
    };
    /** The connection's state; `state` events report its changes. @type {ConnectionState} */
    this.state = "connecting";
    this.#open();
  }

  /**
   * Listens to `state` changes, `dropped` notices, `error`s no request was waiting for, and
   * `resubscribed` reports after a reconnect. Returns a function that removes the listener.
   * @template {keyof ClientEvents} K
   * @param {K} event
   * @param {(e: ClientEvents[K]) => void} listener
   * @returns {() => void}
   */
  on(event, listener) {
    return this.#listen(event, listener, false);
  }

  /**
   * Like `on`, for the next event only.
   * @template {keyof ClientEvents} K
   * @param {K} event
   * @param {(e: ClientEvents[K]) => void} listener
   * @returns {() => void}
   */
  once(event, listener) {
    return this.#listen(event, listener, true);
  }

  /**
   * Removes a listener added with `on` or `once`.
   * @template {keyof ClientEvents} K
   * @param {K} event
   * @param {(e: ClientEvents[K]) => void} listener
   */
  off(event, listener) {
    this.#listeners.get(event)?.delete(listener);
  }

  /** @param {string} event @param {(e: any) => void} listener @param {boolean} once */
  #listen(event, listener, once) {
    let map = this.#listeners.get(event);
    if (!map) this.#listeners.set(event, (map = new Map()));
    map.set(listener, once);
    return () => this.off(/** @type {any} */ (event), listener);
  }

  /**
   * @template {keyof ClientEvents} K
   * @param {K} event
   * @param {ClientEvents[K]} detail
   */
  #emit(event, detail) {
    const map = this.#listeners.get(event);
    for (const [l, once] of [...(map ?? [])]) {
      if (once) map?.delete(l);
      try {
        l(detail);
      } catch (e) {
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }

  /** @param {ConnectionState} state @param {Omit<StateEvent, "state">} [extra] */
  #setState(state, extra = {}) {
    this.state = state;
    this.#emit("state", { state, ...extra });
  }

  async #token() {
    const t = this.#options.token;
    return typeof t === "function" ? await t() : t;
  }

  async #open() {
    let url = this.url;
    let token;
    try {
      token = await this.#token();
    } catch (e) {
      this.#emit("error", new HeraldError("token", `the token callback failed: ${e}`));
      return this.#scheduleReconnect(undefined, undefined);
    }
    if (this.state === "closed") return;
    if (token && this.#options.tokenIn === "query") {
      const u = new URL(url);
      u.searchParams.set("token", token);
      url = u.toString();
    }
    /** @type {WebSocket} */
    let ws;
    try {
      ws = new this.#WebSocket(url);
    } catch (e) {
      // A malformed URL never gets better by retrying.
      this.#emit("error", new HeraldError("bad_url", `cannot open a WebSocket to ${url}: ${e}`));
      this.#setState("closed");
      return this.#failWaiting();
    }
    ws.binaryType = "arraybuffer";
    this.#ws = ws;
    this.#wsOpen = false;
    ws.onopen = () => this.#opened(ws, token);
    ws.onmessage = (ev) => this.#receive(ev.data);
    ws.onclose = (ev) => this.#closed(ws, ev.code, ev.reason);
    let opened = false;
    ws.addEventListener("open", () => (opened = true));
    // An open socket's error is followed by a close event carrying the code. A connection that
    // never opened may get no close event at all (Node 20's WebSocket), so that ends it here.
    ws.onerror = () => {
      if (!opened) this.#closed(ws, 1006, "connection failed");
    };
  }

  /** @param {WebSocket} ws @param {string | undefined} token */
  #opened(ws, token) {
    if (ws !== this.#ws) return;
    const reconnected = this.#everOpened;
    this.#everOpened = true;
    this.#wsOpen = true;
    this.#attempt = 0;
    if (token && this.#options.tokenIn === "message") {
      this.#request({ op: "auth", token }).reply.then(
        (r) => this.#scheduleRefresh(r.exp),
        (e) => this.#emit("error", e),
      );
    } else if (token) {
      // herald does not report the expiry of a token that came with the upgrade request.
      this.#scheduleRefresh(jwtExpiry(token));
    }
    for (const [pattern, subs] of this.#patterns) this.#sendSubscribe(pattern, subs, reconnected);
    this.#setState("open");
    for (const w of this.#waitingForOpen.splice(0)) w.resolve();
  }

  /**
   * Re-authenticates on the live connection before the token expires: `refreshBeforeSecs`
   * before `exp`, but never in the first half of the time left, so that a token living less
   * than `refreshBeforeSecs` is refreshed once per half-life rather than in a tight loop.
   * @param {number | undefined} exp  Unix seconds (from `authed`, or the token's own claim).
   */
  #scheduleRefresh(exp) {
    clearTimeout(this.#refreshTimer);
    if (typeof this.#options.token !== "function" || !exp) return;
    const left = exp * 1000 - Date.now();
    const ms = Math.max(left - this.#options.refreshBeforeSecs * 1000, left / 2);
    this.#refreshTimer = setTimeout(async () => {
      try {
        const token = await this.#token();
        const next = (await this.#call({ op: "auth", token })).exp;
        // Without a later expiry, refreshing again would only come ever faster until herald
        // refuses the lapsed token: let it close with 4001 and reconnect instead.
        if (next > exp) this.#scheduleRefresh(next);
        else if (next !== undefined) this.#emit("error", new HeraldError("token", "the token callback gave no token expiring later than the current one"));
      } catch (e) {
        this.#emit("error", e instanceof HeraldError ? e : new HeraldError("token", String(e)));
      }
    }, Math.min(Math.max(0, ms), MAX_TIMEOUT_MS));
  }

  /** @param {WebSocket} ws @param {number} code @param {string} reason */
  #closed(ws, code, reason) {
    if (ws !== this.#ws) return;
    const wasOpen = this.#wsOpen;
    this.#ws = null;
    this.#wsOpen = false;
    clearTimeout(this.#refreshTimer);
    for (const [id, p] of this.#pending) {
      if (p.resend) continue; // a subscribe is sent again on the next connection
      this.#pending.delete(id);
      p.reject(new HeraldError("not_connected", `the connection closed (${code} ${reason}) before herald replied`));
    }
    this.#credits.clear(); // a new subscription starts with a fresh window
    this.#replayedToCome = 0;
    if (this.state === "closed") return;
    if (code === 4003 || !this.#options.reconnect) {
      this.#emit("error", new HeraldError("closed", `herald closed the connection: ${code} ${reason}`));
      this.#setState("closed", { code, reason });
      return this.#failWaiting();
    }
    if (!wasOpen) {
      this.#emit("error", new HeraldError("connect_failed", `cannot connect to ${this.url} (${code} ${reason}): herald is not reachable there, or the URL is wrong (herald's WebSocket is at /ws)`));
      if (!this.#everOpened && !this.#probed) {
        this.#probed = true;
        return void this.#probe().then((notFound) => {
          if (this.state === "closed") return;
          if (!notFound) return this.#scheduleReconnect(code, reason);
          this.#emit("error", new HeraldError("not_found", `${httpUrl(this.url)} answered HTTP 404: nothing serves WebSockets at this path (herald's is /ws)`));
          this.close();
        });
      }
    }
    this.#scheduleReconnect(code, reason);
  }

  /**
   * Asks the URL over HTTP why its first WebSocket never opened: true for a 404, which means
   * that nothing serves WebSockets at that path and no retry mends it. False when `fetch` is
   * missing or cannot read the answer (unreachable, another origin in a browser, no answer
   * within 2 s): then the retries go on.
   */
  async #probe() {
    if (typeof fetch !== "function") return false;
    try {
      return (await fetch(httpUrl(this.url), { signal: AbortSignal.timeout(2000) })).status === 404;
    } catch {
      return false;
    }
  }

  /** @param {number | undefined} code @param {string | undefined} reason */
  #scheduleReconnect(code, reason) {
    this.#attempt += 1;
    // Exponential backoff with "equal jitter": half the delay fixed, half random, so that many
    // clients cut off at once (a restart) do not come back in lock step.
    const full = Math.min(this.#options.maxDelayMs, this.#options.minDelayMs * 2 ** (this.#attempt - 1));
    const delayMs = Math.round(full / 2 + (Math.random() * full) / 2);
    this.#setState("reconnecting", { attempt: this.#attempt, delayMs, code, reason });
    this.#retryTimer = setTimeout(() => this.#open(), delayMs);
  }

  #failWaiting() {
    for (const [id, p] of this.#pending) {
      this.#pending.delete(id);
      p.reject(new HeraldError("closed", "the client is closed"));
    }
    for (const w of this.#waitingForOpen.splice(0)) w.reject(new HeraldError("closed", "the client is closed"));
    for (const subs of this.#patterns.values()) {
      for (const s of subs) if (!s.settled) s.rejectReady(new HeraldError("closed", "the client closed before herald replied"));
    }
  }

  /** Closes the connection for good: no reconnect; pending requests fail with `closed`. */
  close() {
    if (this.state === "closed") return;
    this.#setState("closed");
    clearTimeout(this.#retryTimer);
    clearTimeout(this.#refreshTimer);
    this.#failWaiting();
    const ws = this.#ws;
    this.#ws = null;
    ws?.close(1000, "client closed");
  }

  /**
   * Resolves when the connection is open (without a time limit; rejects once closed).
   * @returns {Promise<void>}
   */
  whenOpen() {
    if (this.state === "open") return Promise.resolve();
    if (this.state === "closed") return Promise.reject(new HeraldError("closed", "the client is closed"));
    return new Promise((resolve, reject) => this.#waitingForOpen.push({ resolve: () => resolve(undefined), reject }));
  }

  /**
   * Sends a request with a fresh id; `reply` settles with herald's answer (rejects with its
   * error, or `not_connected` when the connection closes first, unless `resend`).
   * @param {Record<string, any>} body
   * @param {Uint8Array} [binary]
   * @param {boolean} [resend]
   * @returns {{id: number, reply: Promise<any>}}
   */
  #request(body, binary, resend = false) {
    const id = this.#nextId++;
    const reply = new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, resend });
      this.#send({ ...body, id }, binary);
    });
    return { id, reply };
  }

  /**
   * A request with a time limit: waits for the connection, sends `body` and (with `ack`) waits
   * for herald's reply, all within `requestTimeoutMs` of the call and until `signal` aborts.
   * @param {Record<string, any>} body
   * @param {{binary?: Uint8Array, signal?: AbortSignal, ack?: boolean}} [extra]
   * @returns {Promise<any>}
   */
  async #call(body, { binary, signal, ack = true } = {}) {
    if (signal?.aborted) throw aborted(body.op, signal);
    if (this.state === "closed") throw new HeraldError("closed", "the client is closed");
    const ms = this.#options.requestTimeoutMs;
    /** @type {number | undefined} */
    let id;
    /** @type {{resolve: () => void, reject: (e: HeraldError) => void} | undefined} */
    let waiter;
    /** @type {(e: HeraldError) => void} */
    let stop = () => {};
    /** @type {Promise<never>} */
    const stopped = new Promise((_, reject) => (stop = reject));
    const timer = setTimeout(() => {
      const what = id === undefined ? `no connection to herald within ${ms} ms: the ${body.op} was not sent` : `no reply to ${body.op} within ${ms} ms`;
      stop(new HeraldError("timeout", what));
    }, ms);
    const onAbort = () => stop(aborted(body.op, /** @type {AbortSignal} */ (signal)));
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      if (this.state !== "open") {
        /** @type {Promise<void>} */
        const open = new Promise((resolve, reject) => this.#waitingForOpen.push((waiter = { resolve, reject })));
        await Promise.race([open, stopped]);
      }
      if (!ack) return this.#send(body, binary);
      const r = this.#request(body, binary);
      id = r.id;
      return await Promise.race([r.reply, stopped]);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (waiter) this.#waitingForOpen = this.#waitingForOpen.filter((w) => w !== waiter);
      if (id !== undefined) this.#pending.delete(id);
    }
  }

  /** @param {Record<string, any>} body @param {Uint8Array} [binary] */
  #send(body, binary) {
    const ws = this.#ws;
    if (!ws) throw new HeraldError("not_connected", `not connected: the ${body.op} was not sent`);
    ws.send(binary ? encodeBinaryFrame(body, binary) : JSON.stringify(body));
  }

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
  subscribe(pattern, handler, options = {}) {
    if (typeof pattern !== "string") throw new HeraldError("bad_argument", `subscribe: the pattern must be a string, not ${typeof pattern}`);
    if (typeof handler !== "function") throw new HeraldError("bad_argument", `subscribe: the handler must be a function, not ${typeof handler}`);
    const sub = new Sub(this, pattern, handler, options);
    if (this.state === "closed") {
      sub.active = false;
      sub.rejectReady(new HeraldError("closed", "the client is closed"));
      return sub;
    }
    let subs = this.#patterns.get(pattern);
    if (!subs) this.#patterns.set(pattern, (subs = new Set()));
    subs.add(sub);
    // While not open, the next connection's `opened` subscribes every held pattern.
    if (this.state === "open") this.#sendSubscribe(pattern, new Set([sub]), false);
    return sub;
  }

  /**
   * Sends one `sub` for `subs` (all on `pattern`): the union of their options, `since` from
   * their positions (the earliest per topic, so that every one of them is filled), and the
   * cursor of the oldest of them that has one (the earliest: the replay covers them all).
   * @param {string} pattern
   * @param {Set<Sub>} subs
   * @param {boolean} reconnected  Report the outcome as a `resubscribed` event.
   */
  #sendSubscribe(pattern, subs, reconnected) {
    /** @type {Record<string, any>} */
    const body = { op: "sub", topic: pattern };
    /** @type {Record<string, Position>} */
    const since = {};
    /** @type {string | undefined} */
    let cursor;
    for (const s of subs) {
      const o = s.options;
      if (o.snapshot) body.snapshot = true;
      if (o.policy) body.policy = o.policy;
      if (o.maxRate !== undefined) body.max_rate = o.maxRate;
      if (o.window !== undefined) body.window = o.window;
      if (o.windowBytes !== undefined) body.window_bytes = o.windowBytes;
      cursor ??= s.cursor;
      for (const [topic, pos] of s.positions) {
        const have = since[topic];
        if (!have || (have.epoch === pos.epoch && pos.seq < have.seq)) since[topic] = pos;
      }
    }
    if (Object.keys(since).length > 0) body.since = since;
    if (cursor !== undefined) body.cursor = cursor;
    this.#request(body, undefined, true).reply.then(
      (r) => {
        for (const s of subs) {
          s.cursor ??= r.cursor;
          s.resolveReady(r);
        }
        if (reconnected) {
          this.#emit("resubscribed", { pattern, recovered: r.recovered === true, replayed: r.replayed ?? 0, gaps: r.gaps ?? [] });
        }
      },
      (e) => {
        if (e.code === "closed") return; // close() settled every subscription already
        // herald refused the pattern (invalid, forbidden, too many): it will never deliver.
        for (const s of subs) {
          s.active = false;
          this.#patterns.get(pattern)?.delete(s);
          s.rejectReady(e);
        }
        if (this.#patterns.get(pattern)?.size === 0) this.#patterns.delete(pattern);
        this.#emit("error", e);
      },
    );
  }

  /**
   * Removes a subscription; herald is told when it was the last one on its pattern.
   * @param {Subscription} subscription
   * @param {RequestOptions} [options]
   * @returns {Promise<void>}
   */
  async unsubscribe(subscription, options = {}) {
    const sub = /** @type {Sub} */ (subscription);
    sub.active = false;
    const subs = this.#patterns.get(sub.pattern);
    if (!subs?.delete(sub) || subs.size > 0) return;
    this.#patterns.delete(sub.pattern);
    this.#credits.delete(sub.pattern);
    if (this.state !== "open") return; // the next connection simply does not resubscribe
    await this.#call({ op: "unsub", topic: sub.pattern }, { signal: options.signal });
  }

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
  /**
   * @overload
   * @param {string} topic
   * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
   * @param {PublishOptionsAck} [options]
   * @returns {Promise<Ack>}
   */
  /**
   * @overload
   * @param {string} topic
   * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
   * @param {PublishOptions} [options]
   * @returns {Promise<Ack | undefined>}
   */
  /**
   * @param {string} topic
   * @param {string | ArrayBuffer | ArrayBufferView | Blob | any} data
   * @param {PublishOptions} [options]
   * @returns {Promise<Ack | undefined>}
   */
  async publish(topic, data, options = {}) {
    if (typeof topic !== "string") throw new HeraldError("bad_argument", `publish: the topic must be a string, not ${typeof topic}`);
    if (options.ct !== undefined && typeof options.ct !== "string") throw new HeraldError("bad_argument", `publish: ct must be a string, not ${typeof options.ct}`);
    /** @type {Record<string, any>} */
    const head = { op: "pub", topic };
    let ct = options.ct;
    /** @type {Uint8Array | undefined} */
    let binary;
    if (typeof data === "string") {
      head.data = data;
    } else if (data instanceof ArrayBuffer) {
      binary = new Uint8Array(data);
    } else if (ArrayBuffer.isView(data)) {
      binary = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    } else if (typeof Blob !== "undefined" && data instanceof Blob) {
      binary = new Uint8Array(await data.arrayBuffer());
      ct ??= data.type || undefined;
    } else {
      try {
        head.data = JSON.stringify(data);
      } catch (e) {
        throw new HeraldError("bad_argument", `publish: the value cannot be sent as JSON: ${e}`);
      }
      if (head.data === undefined) throw new HeraldError("bad_argument", `publish: ${typeof data} has no JSON form (publish a string, bytes, or a JSON value)`);
      ct ??= "application/json";
    }
    if (ct) head.ct = ct;
    if (options.stamp) head.stamp = true;
    if (options.ack === false) {
      await this.#call(head, { binary, signal: options.signal, ack: false });
      return undefined;
    }
    const r = await this.#call(head, { binary, signal: options.signal });
    return { topic: r.topic, seq: r.seq };
  }

  /**
   * An application-level round trip to herald, within `requestTimeoutMs`.
   * @param {RequestOptions} [options]
   */
  async ping(options = {}) {
    await this.#call({ op: "ping" }, { signal: options.signal });
  }

  /** @param {string | ArrayBuffer} raw */
  #receive(raw) {
    /** @type {Record<string, any>} */
    let head;
    /** @type {string | Uint8Array | undefined} */
    let payload;
    try {
      if (typeof raw === "string") head = JSON.parse(raw);
      else [head, payload] = decodeBinaryFrame(raw);
    } catch (e) {
      this.#emit("error", new HeraldError("bad_frame", `herald sent a frame the client cannot read: ${e}`));
      return;
    }
    switch (head.op) {
      case "msg": {
        const replayed = this.#replayedToCome > 0;
        if (replayed) this.#replayedToCome -= 1;
        const body = payload ?? head.data;
        return this.#deliver(new Message(head, body), replayed, body);
      }
      case "dropped":
        return this.#emit("dropped", { topic: head.topic, count: head.count, reason: head.reason });
      case "snapshot":
        // More of a large snapshot, served after the reply: the next `count` messages.
        this.#replayedToCome += head.count ?? 0;
        return;
      case "error": {
        const err = new HeraldError(head.code, head.message);
        const p = head.id !== undefined && this.#pending.get(head.id);
        if (p) {
          this.#pending.delete(head.id);
          p.reject(err);
        } else {
          this.#emit("error", err);
        }
        return;
      }
      default: {
        // herald sends a subscription's replayed messages right after its reply.
        if (head.op === "subscribed") this.#replayedToCome += head.replayed ?? 0;
        const p = head.id !== undefined && this.#pending.get(head.id);
        if (p) {
          this.#pending.delete(head.id);
          p.resolve(head);
        }
      }
    }
  }

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
  #deliver(m, replayed, body) {
    const ws = this.#ws;
    /** @type {string | undefined} */
    let charged;
    /** @type {Promise<void>[]} */
    const handled = [];
    for (const [pattern, subs] of this.#patterns) {
      if (!topicMatches(pattern, m.topic)) continue;
      const charges = !replayed && charged === undefined && [...subs].some(isLossless);
      if (charges) charged = pattern;
      for (const sub of subs) {
        if (!sub.accept(m)) continue;
        if (isLossless(sub)) {
          sub.tail = sub.tail.then(() => this.#run(sub, m));
          if (charges) handled.push(sub.tail);
        } else {
          void this.#run(sub, m);
        }
      }
    }
    if (charged !== undefined) {
      const pattern = charged;
      const bytes = hasByteWindow(this.#patterns.get(pattern)) ? payloadBytes(body) : 0;
      void Promise.all(handled).then(() => this.#credit(pattern, ws, bytes));
    }
  }

  /** Runs a handler; its exceptions become `error` events rather than stopping delivery.
   * @param {Sub} sub @param {Message} m */
  async #run(sub, m) {
    if (!sub.active) return;
    try {
      await sub.handler(m);
    } catch (e) {
      this.#emit("error", new HeraldError("handler", `the handler for ${sub.pattern} threw on ${m.topic}: ${e}`));
    }
  }

  /**
   * Grants herald one more message (and its `bytes` of payload, with a byte window) on the
   * lossless subscription to `pattern`. Credits are batched: those earned in one turn of the
   * event loop go out as one `credit` request. A message that came on an earlier connection
   * earns nothing: a resubscription starts with a fresh window.
   * @param {string} pattern
   * @param {WebSocket | null} ws  The connection the message came on.
   * @param {number} bytes
   */
  #credit(pattern, ws, bytes) {
    if (ws !== this.#ws || this.state !== "open" || !this.#patterns.has(pattern)) return;
    const owed = this.#credits.get(pattern);
    if (owed) {
      owed.n += 1;
      owed.bytes += bytes;
      return;
    }
    this.#credits.set(pattern, { n: 1, bytes });
    queueMicrotask(() => {
      const c = this.#credits.get(pattern);
      this.#credits.delete(pattern);
      if (!c || this.#ws !== ws) return;
      /** @type {Record<string, any>} */
      const body = { op: "credit", topic: pattern, n: c.n };
      if (c.bytes > 0) body.bytes = c.bytes;
      this.#send(body);
    });
  }
}

/** The http(s) URL of a ws(s) URL, without its query (which may hold a token).
 * @param {string} url */
function httpUrl(url) {
  const u = new URL(url);
  u.protocol = u.protocol === "wss:" ? "https:" : "http:";
  u.search = "";
  return u.toString();
}

/** The error a request rejects with when its signal aborts.
 * @param {string} op @param {AbortSignal} signal */
function aborted(op, signal) {
  return new HeraldError("aborted", `the ${op} was aborted${signal.reason !== undefined ? `: ${signal.reason}` : ""}`);
}

/** @param {Sub} sub */
function isLossless(sub) {
  return sub.options.policy === "lossless";
}

/** Whether a pattern's lossless subscription asked for a byte window.
 * @param {Set<Sub> | undefined} subs */
function hasByteWindow(subs) {
  return [...(subs ?? [])].some((s) => isLossless(s) && s.options.windowBytes !== undefined);
}

/** What herald counts against a byte window: a text message's `data` in UTF-8 bytes, a binary
 * message's bytes after the header.
 * @param {string | Uint8Array | undefined} body */
function payloadBytes(body) {
  if (body === undefined) return 0;
  return typeof body === "string" ? encoder.encode(body).length : body.byteLength;
}

/** The longest delay `setTimeout` takes (2³¹−1 ms, about 24.8 days); longer ones fire at once. */
const MAX_TIMEOUT_MS = 2 ** 31 - 1;

/**
 * The `exp` claim of a JWT, read without verifying it (herald verifies; the client only needs to
 * know when to refresh), or undefined when the token is not a JWT carrying one.
 * @param {string} token
 * @returns {number | undefined}
 */
function jwtExpiry(token) {
  try {
    const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const exp = JSON.parse(decoder.decode(Uint8Array.from(atob(payload), (c) => c.charCodeAt(0)))).exp;
    return typeof exp === "number" ? exp : undefined;
  } catch {
    return undefined;
  }
}
