// herald-client against a real herald process (HERALD_BIN). Run with
// `node --experimental-websocket --test` (Node 20 has no global WebSocket without the flag).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { connect, HeraldError, topicMatches, encodeBinaryFrame, decodeBinaryFrame } from "../src/herald-client.js";
import { Herald, HERALD_BIN, until, freePort, tempDir, heraldWith } from "./herald.js";
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { promisify } from "node:util";

/** @type {Herald} */
let herald;
before(async () => {
  herald = await Herald.start();
});
after(async () => {
  await herald?.stop();
});

/** A client that collects what it receives; closed at the end of the test. */
function client(t, options = {}, url = herald.ws) {
  const c = connect(url, { minDelayMs: 50, maxDelayMs: 400, ...options });
  t.after(() => c.close());
  return c;
}

/**
 * A WebSocket constructor for `connect` that lets a test watch the wire through the public API:
 * every socket it opened, every frame sent (its JSON, or a binary frame's header), and
 * listeners for frames sent and received (called before the client handles them).
 */
function tap() {
  /** @type {WebSocket[]} */
  const sockets = [];
  /** @type {Record<string, any>[]} */
  const sent = [];
  /** @type {((head: Record<string, any>) => void)[]} */
  const onSend = [];
  /** @type {((head: Record<string, any>) => void)[]} */
  const onReceive = [];
  class Tapped extends WebSocket {
    constructor(url, protocols) {
      super(url, protocols);
      sockets.push(this);
      this.addEventListener("message", (ev) => {
        const head = typeof ev.data === "string" ? JSON.parse(ev.data) : decodeBinaryFrame(ev.data)[0];
        for (const l of onReceive) l(head);
      });
    }
    send(data) {
      const head = typeof data === "string" ? JSON.parse(data) : decodeBinaryFrame(data.slice().buffer)[0];
      sent.push(head);
      for (const l of onSend) l(head);
      super.send(data);
    }
  }
  return { WebSocket: Tapped, sockets, sent, onSend, onReceive };
}

test("topic matching follows the protocol's grammar", () => {
  assert.ok(topicMatches("a/*/c", "a/b/c"));
  assert.ok(topicMatches("a/>", "a/b/c"));
  assert.ok(topicMatches(">", "a"));
  assert.ok(!topicMatches("a/>", "a"), "> needs at least one level");
  assert.ok(!topicMatches("a/*", "a/b/c"));
  assert.ok(!topicMatches("a/b*", "a/bc"), "b* is an ordinary level");
  assert.ok(topicMatches("a/b*", "a/b*"));
  assert.ok(!topicMatches("a/b/c", "a/b"));
});

test("binary frame layout round-trips", () => {
  const payload = new Uint8Array([0, 1, 2, 255]);
  const frame = encodeBinaryFrame({ op: "pub", topic: "t" }, payload);
  assert.equal(new DataView(frame.buffer).getUint32(0), JSON.stringify({ op: "pub", topic: "t" }).length);
  const [head, body] = decodeBinaryFrame(frame.buffer);
  assert.deepEqual(head, { op: "pub", topic: "t" });
  assert.deepEqual([...body], [0, 1, 2, 255]);
  assert.throws(() => decodeBinaryFrame(new Uint8Array([0, 0, 0, 9, 1]).buffer), HeraldError);
});

test("publishes text and JSON and receives them with seq, epoch and stamp", async (t) => {
  const c = client(t);
  const got = [];
  const sub = c.subscribe("sdk/text/>", (m) => got.push(m));
  await sub.ready;
  const ack = await c.publish("sdk/text/a", "hello", { stamp: true });
  assert.equal(ack?.topic, "sdk/text/a");
  assert.equal(ack?.seq, 1);
  await c.publish("sdk/text/b", { price: 1.25 });
  await until(() => got.length === 2, "two messages");
  assert.equal(got[0].data, "hello");
  assert.equal(got[0].seq, 1);
  assert.equal(typeof got[0].epoch, "string");
  assert.ok(Math.abs(got[0].ts / 1000 - Date.now()) < 5_000, "ts is herald's wall clock in µs");
  assert.equal(got[1].ct, "application/json");
  assert.deepEqual(got[1].json(), { price: 1.25 });
});

test("binary payloads travel unchanged: Uint8Array, ArrayBuffer, Blob, and HTTP bodies", async (t) => {
  const c = client(t);
  const got = [];
  await c.subscribe("sdk/bin/>", (m) => got.push(m)).ready;
  const bytes = new Uint8Array(70_000).map((_, i) => (i * 7) & 0xff);
  await c.publish("sdk/bin/u8", bytes, { ct: "application/octet-stream" });
  await c.publish("sdk/bin/ab", bytes.buffer.slice(0, 1000));
  await c.publish("sdk/bin/blob", new Blob([bytes.subarray(0, 10)], { type: "image/fits" }));
  // A view into a larger buffer sends only its own bytes.
  await c.publish("sdk/bin/view", bytes.subarray(5, 9));
  const http = await herald.publishHttp("sdk/bin/http", bytes.subarray(0, 300), "image/jpeg");
  assert.equal(http.status, 200);
  await until(() => got.length === 5, "five binary messages");
  const byTopic = Object.fromEntries(got.map((m) => [m.topic, m]));
  assert.ok(byTopic["sdk/bin/u8"].data instanceof Uint8Array);
  assert.deepEqual(byTopic["sdk/bin/u8"].data, bytes);
  assert.equal(byTopic["sdk/bin/u8"].ct, "application/octet-stream");
  assert.deepEqual(byTopic["sdk/bin/ab"].data, bytes.subarray(0, 1000));
  assert.deepEqual(byTopic["sdk/bin/blob"].data, bytes.subarray(0, 10));
  assert.equal(byTopic["sdk/bin/blob"].ct, "image/fits", "a Blob's type becomes ct");
  assert.deepEqual(byTopic["sdk/bin/view"].data, bytes.subarray(5, 9));
  assert.deepEqual(byTopic["sdk/bin/http"].data, bytes.subarray(0, 300));
  assert.equal(byTopic["sdk/bin/http"].ct, "image/jpeg");
});

test("overlapping subscriptions each get the message once; others do not", async (t) => {
  const c = client(t);
  const calls = { all: [], star: [], same1: [], same2: [], other: [] };
  await Promise.all([
    c.subscribe("sdk/ov/>", (m) => calls.all.push(m.seq)).ready,
    c.subscribe("sdk/ov/*/x", (m) => calls.star.push(m.seq)).ready,
    c.subscribe("sdk/ov/a/x", (m) => calls.same1.push(m.seq)).ready,
    c.subscribe("sdk/ov/a/x", (m) => calls.same2.push(m.seq)).ready,
    c.subscribe("sdk/other/>", (m) => calls.other.push(m.seq)).ready,
  ]);
  await c.publish("sdk/ov/a/x", "1");
  await c.publish("sdk/ov/a/y", "2");
  await until(() => calls.all.length === 2, "both messages on sdk/ov/>");
  await sleep(100);
  assert.deepEqual(calls, { all: [1, 1], star: [1], same1: [1], same2: [1], other: [] });
});

test("unsubscribe stops one handler; the pattern stays while another holds it", async (t) => {
  const c = client(t);
  const a = [];
  const b = [];
  const sa = c.subscribe("sdk/unsub/t", (m) => a.push(m.data));
  const sb = c.subscribe("sdk/unsub/t", (m) => b.push(m.data));
  await Promise.all([sa.ready, sb.ready]);
  await sa.unsubscribe();
  await c.publish("sdk/unsub/t", "x");
  await until(() => b.length === 1, "the remaining handler");
  assert.deepEqual(a, []);
  await sb.unsubscribe();
  await c.publish("sdk/unsub/t", "y");
  await c.ping(); // herald answers in order: anything delivered would have arrived first
  assert.deepEqual(b, ["x"]);
});

test("snapshot delivers the last value first", async (t) => {
  await herald.publishHttp("sdk/snap/a", "old");
  await herald.publishHttp("sdk/snap/a", "last");
  const c = client(t);
  const got = [];
  await c.subscribe("sdk/snap/>", (m) => got.push(m.data), { snapshot: true }).ready;
  await until(() => got.length === 1, "the snapshot");
  assert.deepEqual(got, ["last"]);
});

test("herald's errors reject the request that caused them", async (t) => {
  const wire = tap();
  const c = client(t, { WebSocket: wire.WebSocket });
  const errors = [];
  c.on("error", (e) => errors.push(e));
  const bad = c.subscribe("sdk/a//b", () => {});
  await assert.rejects(bad.ready, (e) => e instanceof HeraldError && e.code === "invalid_topic");
  await assert.rejects(c.publish("sdk/*/x", "no"), (e) => e instanceof HeraldError && e.code === "publish_to_pattern");
  await assert.rejects(c.publish("", "no"), (e) => e instanceof HeraldError && e.code === "invalid_topic");
  assert.deepEqual(errors.map((e) => e.code), ["invalid_topic"], "a refused subscription is also reported as an event");
  const subsBefore = wire.sent.filter((f) => f.op === "sub").length;
  wire.sockets.at(-1)?.close();
  await until(() => wire.sockets.length === 2 && c.state === "open", "the reconnect");
  await c.ping();
  assert.equal(wire.sent.filter((f) => f.op === "sub").length, subsBefore, "a refused pattern is not resubscribed later");
});

test("a handler that throws is reported and delivery goes on", async (t) => {
  const c = client(t);
  const errors = [];
  const got = [];
  c.on("error", (e) => errors.push(e));
  await c.subscribe("sdk/throw", (m) => {
    got.push(m.data);
    if (m.data === "1") throw new Error("boom");
  }).ready;
  await c.publish("sdk/throw", "1");
  await c.publish("sdk/throw", "2");
  await until(() => got.length === 2, "both messages");
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, "handler");
  assert.match(errors[0].message, /boom/);
});

test("a dropped socket reconnects, resubscribes with since, and recovers the gap", async (t) => {
  const wire = tap();
  const c = client(t, { WebSocket: wire.WebSocket });
  const got = [];
  const states = [];
  const resubscribed = [];
  c.on("state", (s) => states.push(s.state));
  c.on("resubscribed", (r) => resubscribed.push(r));
  await c.subscribe("sdk/drop/>", (m) => got.push(`${m.topic}#${m.seq}`)).ready;
  await c.publish("sdk/drop/a", "1");
  await until(() => got.length === 1, "the first message");
  const open = until(() => c.state === "open" && states.includes("reconnecting"), "the reconnect");
  wire.sockets.at(-1)?.close(); // the network goes away under the client
  await until(() => c.state !== "open", "the client to notice");
  for (let i = 2; i <= 4; i++) await herald.publishHttp("sdk/drop/a", String(i));
  await herald.publishHttp("sdk/drop/b", "new topic");
  await open;
  await until(() => resubscribed.length === 1, "the resubscribe report");
  assert.equal(resubscribed[0].pattern, "sdk/drop/>");
  assert.equal(resubscribed[0].recovered, true);
  assert.deepEqual(resubscribed[0].gaps, []);
  const onA = () => got.filter((g) => g.startsWith("sdk/drop/a#"));
  await until(() => onA().length === 4, () => `the replay (got ${got})`);
  assert.deepEqual(onA(), ["sdk/drop/a#1", "sdk/drop/a#2", "sdk/drop/a#3", "sdk/drop/a#4"]);
  // sdk/drop/b, a topic the client never saw: the next test.
  await c.publish("sdk/drop/a", "5");
  await until(() => onA().length === 5, "a live message after the reconnect");
});

for (const snapshot of [false, true]) {
  test(`a wildcard subscription recovers topics first published while the client was away (snapshot: ${snapshot})`, async (t) => {
    const prefix = `sdk/w${snapshot ? "s" : ""}`;
    const wire = tap();
    // The first retry waits at least 300 ms: both publishes below land while the client is away.
    const c = client(t, { WebSocket: wire.WebSocket, minDelayMs: 600, maxDelayMs: 600 });
    const got = [];
    const resubscribed = [];
    /** @type {Record<string, any>[]} */
    const replies = [];
    c.on("resubscribed", (r) => resubscribed.push(r));
    wire.onReceive.push((head) => head.op === "subscribed" && replies.push(head));
    const first = await c.subscribe(`${prefix}/>`, (m) => got.push(`${m.topic.slice(prefix.length + 1)}:${m.data}`), { snapshot }).ready;
    await c.publish(`${prefix}/a`, "a1");
    await until(() => got.length === 1, "a1");
    wire.sockets.at(-1)?.close();
    await until(() => c.state === "reconnecting", "the client to notice");
    await herald.publishHttp(`${prefix}/b`, "b1"); // a topic the client has never seen
    await herald.publishHttp(`${prefix}/b`, "b2");
    await until(() => resubscribed.length === 1, "the resubscribe report", 5_000);
    assert.equal(wire.sockets.length, 2);
    // The resubscribe names what the client saw and carries the cursor of the first reply.
    const resub = wire.sent.filter((f) => f.op === "sub").at(-1);
    assert.deepEqual(Object.keys(resub?.since ?? {}), [`${prefix}/a`]);
    assert.equal(typeof first.cursor, "string", "herald's first reply carries a cursor");
    assert.equal(resub?.cursor, first.cursor, "the first reply's cursor is sent back");
    // The client reports herald's verdict as herald gave it...
    const reply = replies.at(-1);
    assert.equal(resubscribed[0].recovered, reply?.recovered === true);
    assert.deepEqual(resubscribed[0].gaps, reply?.gaps ?? []);
    assert.equal(resubscribed[0].replayed, reply?.replayed ?? 0);
    // ...and herald, holding both, replays both: nothing is missing, in order, once.
    assert.equal(resubscribed[0].recovered, true, JSON.stringify(reply));
    await until(() => got.length === 3, () => `b1 and b2 (got ${got})`);
    await c.ping();
    assert.deepEqual(got, ["a:a1", "b:b1", "b:b2"]);
  });
}

test("a killed and restarted herald: reconnect with backoff, told exactly what was lost", async (t) => {
  const c = client(t, { minDelayMs: 100, maxDelayMs: 800 });
  const got = [];
  const reconnecting = [];
  const resubscribed = [];
  c.on("state", (s) => s.state === "reconnecting" && reconnecting.push(s));
  c.on("resubscribed", (r) => resubscribed.push(r));
  await c.subscribe("sdk/kill/>", (m) => got.push({ seq: m.seq, epoch: m.epoch, data: m.data })).ready;
  await c.publish("sdk/kill/t", "before");
  await until(() => got.length === 1, "the first message");
  await herald.stop("SIGKILL");
  t.after(() => (herald.running ? undefined : herald.spawn())); // later tests need a herald
  await until(() => reconnecting.length >= 4, "four reconnect attempts while herald is down", 10_000);
  // Exponential backoff with jitter: attempt n waits between half and all of min·2^(n-1), capped.
  for (const s of reconnecting) {
    const full = Math.min(800, 100 * 2 ** ((s.attempt ?? 1) - 1));
    assert.ok(s.delayMs >= full / 2 && s.delayMs <= full, `attempt ${s.attempt} waited ${s.delayMs} ms (full ${full})`);
  }
  assert.deepEqual(reconnecting.slice(0, 4).map((s) => s.attempt), [1, 2, 3, 4]);
  await herald.spawn();
  await until(() => resubscribed.length === 1, "the resubscribe after the restart", 10_000);
  assert.equal(resubscribed[0].recovered, false, "history died with the process");
  assert.deepEqual(resubscribed[0].gaps.map((g) => [g.topic, g.reason]), [["sdk/kill/t", "unknown_topic"]]);
  // The new epoch's first message is delivered even though its seq (1) is not above the old one.
  await herald.publishHttp("sdk/kill/t", "after");
  await until(() => got.length === 2, "the message after the restart");
  assert.equal(got[1].data, "after");
  assert.equal(got[1].seq, 1);
  assert.notEqual(got[1].epoch, got[0].epoch);
});

test("requests made while disconnected wait for the connection", async (t) => {
  const wire = tap();
  const c = client(t, { WebSocket: wire.WebSocket });
  const got = [];
  c.subscribe("sdk/early", (m) => got.push(m.data)); // before the socket is open
  const ack = await c.publish("sdk/early", "x");
  assert.equal(ack?.seq, 1);
  await until(() => got.length === 1, "the message");
  assert.deepEqual(wire.sent.filter((f) => f.op === "sub").map((f) => f.topic), ["sdk/early"], "subscribed once, not twice");
});

test("a malformed URL closes the client with an error instead of retrying", async (t) => {
  const errors = [];
  const c = connect("http://[not a url", { minDelayMs: 10 });
  t.after(() => c.close());
  c.on("error", (e) => errors.push(e.code));
  await assert.rejects(c.publish("x", "y"), (e) => e.code === "closed");
  assert.equal(c.state, "closed");
  await sleep(50);
  assert.deepEqual(errors, ["bad_url"]);
});

test("close() ends the client: no reconnect, pending requests fail", async (t) => {
  const c = client(t);
  await c.whenOpen();
  const states = [];
  c.on("state", (s) => states.push(s.state));
  c.close();
  await assert.rejects(c.publish("sdk/closed", "x"), (e) => e.code === "closed");
  await sleep(200);
  assert.deepEqual(states, ["closed"]);
});

/** A counter in herald's /metrics exposition, summed over the series carrying `label`. */
async function metric(h, name, label) {
  const text = await (await fetch(`${h.http}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith(`${name}{`) && l.includes(label))
    .reduce((sum, l) => sum + Number(l.split(" ").pop()), 0);
}

test("lossless: herald never has more than `window` messages outstanding; credit follows the handler", async (t) => {
  const WINDOW = 4;
  const COUNT = 40;
  const wire = tap();
  const c = client(t, { WebSocket: wire.WebSocket });
  const publisher = client(t);
  const errors = [];
  c.on("error", (e) => errors.push(e));
  // A value herald already holds: the snapshot replays it, which spends no credit and must
  // earn none back (else herald would be granted WINDOW + 1).
  await herald.publishHttp("sdk/ll/flow", "snap");
  await c.whenOpen();
  // What crossed the wire: live message frames in, credit out. herald is bound by the window
  // only through these, so their difference is exactly what it has outstanding.
  let arrived = 0;
  let credited = 0;
  let maxOutstanding = 0;
  let settled = 0;
  const creditBeyondSettled = [];
  wire.onReceive.push((head) => {
    if (head.op === "msg" && head.data !== "snap") {
      arrived += 1;
      maxOutstanding = Math.max(maxOutstanding, arrived - credited);
    }
  });
  wire.onSend.push((body) => {
    if (body.op === "credit") {
      credited += body.n;
      if (credited > settled) creditBeyondSettled.push({ credited, settled });
    }
  });
  const got = [];
  let running = 0;
  await c.subscribe("sdk/ll/>", async (m) => {
    running += 1;
    got.push(m.data);
    await sleep(5 + (got.length % 3) * 5); // a slow consumer, with some jitter
    running -= 1;
    if (m.data !== "snap") settled += 1;
  }, { policy: "lossless", window: WINDOW, snapshot: true }).ready;
  const held = await metric(herald, "herald_policy_actions_total", 'reason="lossless_hold"');
  const sent = Array.from({ length: COUNT }, (_, i) => publisher.publish("sdk/ll/flow", String(i)));
  const acks = await Promise.all(sent);
  assert.deepEqual(acks.map((a) => a?.seq), Array.from({ length: COUNT }, (_, i) => i + 2), "every publish went through, in order");
  await until(() => got.length === COUNT + 1, () => `all messages (got ${got.length})`, 15_000);
  await until(() => credited >= COUNT, () => `credit for every message (${credited})`);
  await c.ping();
  assert.deepEqual(got, ["snap", ...Array.from({ length: COUNT }, (_, i) => String(i))], "each message once, in order");
  assert.equal(running, 0);
  assert.equal(maxOutstanding, WINDOW, "herald used the whole window and never more");
  assert.deepEqual(creditBeyondSettled, [], "credit only for handlers that had finished");
  assert.equal(credited, COUNT, "the snapshot earned no credit");
  assert.ok(
    (await metric(herald, "herald_policy_actions_total", 'reason="lossless_hold"')) > held,
    "herald made the publisher wait for credit",
  );
  assert.deepEqual(errors, [], "herald accepted every credit");
});

test("lossless: a snapshot larger than what comes with herald's reply earns no credit either", async (t) => {
  // herald sends the first 1,024 values with its reply and the rest in slices, each announced
  // by a `snapshot` notice: the client counts those as recovered, not live.
  const TOPICS = 3000;
  const wire = tap();
  const c = client(t, { WebSocket: wire.WebSocket });
  const publisher = client(t);
  let credited = 0;
  let notices = 0;
  wire.onSend.push((body) => {
    if (body.op === "credit") credited += body.n;
  });
  wire.onReceive.push((head) => {
    if (head.op === "snapshot") notices += 1;
  });
  const names = Array.from({ length: TOPICS }, (_, i) => `sdk/big/${String(i).padStart(5, "0")}`);
  await Promise.all(names.map((n) => publisher.publish(n, "v", { ack: false })));
  await publisher.publish("sdk/big/last", "v");
  const got = new Set();
  await c.subscribe("sdk/big/>", (m) => {
    got.add(m.topic);
  }, { policy: "lossless", window: 4, snapshot: true }).ready;
  await until(() => got.size === TOPICS + 1, () => `every value (got ${got.size})`, 15_000);
  await c.ping();
  assert.ok(notices > 0, "the snapshot came in slices");
  assert.equal(credited, 0, "the snapshot earned no credit");
});

test("lossless windowBytes: herald never has more payload bytes outstanding than granted; credit grants back what was handled", async (t) => {
  const WINDOW_BYTES = 3000;
  const sizes = Array.from({ length: 24 }, (_, i) => [1000, 700, 300, 1200][i % 4]);
  const wire = tap();
  const c = client(t, { WebSocket: wire.WebSocket });
  const publisher = client(t);
  const errors = [];
  c.on("error", (e) => errors.push(e));
  await c.whenOpen();
  // Payload bytes that arrived minus bytes credited: what herald has outstanding.
  let arrived = 0;
  let credited = 0;
  let maxOutstanding = 0;
  wire.onReceive.push((head) => {
    if (head.op === "msg") {
      arrived += new TextEncoder().encode(head.data).length;
      maxOutstanding = Math.max(maxOutstanding, arrived - credited);
    }
  });
  wire.onSend.push((body) => {
    if (body.op === "credit") credited += body.bytes ?? 0;
  });
  const got = [];
  await c.subscribe("sdk/llb/>", async (m) => {
    got.push(m.data);
    await sleep(5);
  }, { policy: "lossless", windowBytes: WINDOW_BYTES }).ready;
  // Multi-byte characters: bytes, not characters, are counted.
  const payloads = sizes.map((n, i) => String(i).padStart(4, "0") + "é".repeat((n - 4) / 2));
  const acks = await Promise.all(payloads.map((p) => publisher.publish("sdk/llb/x", p)));
  assert.equal(acks.length, sizes.length);
  await until(() => got.length === sizes.length, () => `all messages (got ${got.length})`, 15_000);
  await until(() => credited === arrived, () => `credit for every byte (${credited} of ${arrived})`);
  assert.deepEqual(got, payloads, "each message once, in order");
  assert.ok(maxOutstanding <= WINDOW_BYTES, `at most ${WINDOW_BYTES} bytes outstanding, saw ${maxOutstanding}`);
  assert.ok(maxOutstanding > WINDOW_BYTES - 1200, `the byte window was used (${maxOutstanding})`);
  assert.deepEqual(errors, [], "herald accepted every credit");
});

test("lossless: a subscriber that goes away releases the held publisher; a stuck one is cut after the hold timeout", async (t) => {
  const HOLD_MS = 2000;
  const h = await heraldWith(t, `lossless_hold_timeout_ms = ${HOLD_MS}\n`);
  const publisher = client(t, {}, h.ws);
  const pending = (p) => Promise.race([p.then(() => false), sleep(300).then(() => true)]);

  // 1. The subscriber disappears while a publish waits for its credit.
  const gone = client(t, {}, h.ws);
  await gone.subscribe("sdk/ll/gone", () => new Promise(() => {}), { policy: "lossless", window: 2 }).ready;
  await publisher.publish("sdk/ll/gone", "1");
  await publisher.publish("sdk/ll/gone", "2");
  const third = publisher.publish("sdk/ll/gone", "3");
  assert.ok(await pending(third), "the third publish waits: the window is spent");
  const closedAt = Date.now();
  gone.close();
  assert.equal((await third)?.seq, 3);
  const waited = Date.now() - closedAt;
  assert.ok(waited < HOLD_MS / 2, `released ${waited} ms after the subscriber left, not by the ${HOLD_MS} ms timeout`);

  // 2. The subscriber stays but its handler is stuck: after the hold timeout herald cuts it
  // (4008) and the publish goes ahead. The SDK reconnects, recovers the message it missed as a
  // replay, and nothing is lost or repeated once the handler comes unstuck.
  const stuck = client(t, {}, h.ws);
  const states = [];
  stuck.on("state", (s) => states.push(s));
  const resubscribed = [];
  stuck.on("resubscribed", (r) => resubscribed.push(r));
  let release = () => {};
  const gate = new Promise((r) => (release = r));
  const got = [];
  await stuck.subscribe("sdk/ll/stuck", async (m) => {
    got.push(m.data);
    await gate;
  }, { policy: "lossless", window: 2 }).ready;
  await publisher.publish("sdk/ll/stuck", "a");
  await publisher.publish("sdk/ll/stuck", "b");
  const started = Date.now();
  const c = publisher.publish("sdk/ll/stuck", "c");
  assert.ok(await pending(c), "the third publish waits for credit");
  assert.equal((await c)?.seq, 3);
  const held = Date.now() - started;
  assert.ok(held >= HOLD_MS - 100 && held < HOLD_MS + 2000, `held ${held} ms, about the ${HOLD_MS} ms timeout`);
  await until(() => states.some((s) => s.state === "reconnecting"), "the cut to be reported");
  const cut = states.find((s) => s.state === "reconnecting");
  assert.equal(cut?.code, 4008);
  assert.match(cut?.reason ?? "", /lossless window not replenished/);
  await until(() => resubscribed.length === 1, "the resubscription");
  assert.equal(resubscribed[0].recovered, true, "the message it missed is replayed");
  release();
  await publisher.publish("sdk/ll/stuck", "d");
  await until(() => got.length === 4, () => `four messages (got ${got})`);
  await stuck.ping();
  assert.deepEqual(got, ["a", "b", "c", "d"]);
});

/** Auth on: an HS256 secret, no clock-skew leeway (so a token lapses at its `exp`). */
async function heraldWithAuth(t) {
  const dir = tempDir(t);
  const secret = join(dir, "secret");
  writeFileSync(secret, randomBytes(32).toString("base64"));
  const h = await heraldWith(t, "[auth]\nleeway_secs = 0\n", ["--auth-hs256-secret-file", secret], dir);
  /** `herald token` for `sub`/`pub` patterns, living `ttl` seconds. */
  const token = async (sub, pub, ttl = 3600) => {
    const args = ["token", "--secret-file", secret, "--subject", "sdk-test", "--sub", sub, "--pub", pub, "--ttl", String(ttl)];
    const { stdout } = await promisify(execFile)(/** @type {string} */ (HERALD_BIN), args);
    return stdout.trim();
  };
  return { herald: h, token };
}

test("auth: a token as ?token= or as an auth op; outside its grants is forbidden, a bad token final", async (t) => {
  const { herald: h, token } = await heraldWithAuth(t);
  const grant = "sdk/auth/ok/>";
  for (const tokenIn of /** @type {const} */ (["query", "message"])) {
    const wire = tap();
    const c = client(t, { token: await token(grant, grant), tokenIn, WebSocket: wire.WebSocket }, h.ws);
    const errors = [];
    c.on("error", (e) => errors.push(e.code));
    const got = [];
    await c.subscribe(grant, (m) => got.push(m.data)).ready;
    assert.equal((await c.publish(`sdk/auth/ok/${tokenIn}`, "hi"))?.seq, 1);
    await until(() => got.length === 1, `the message (${tokenIn})`);
    const wide = c.subscribe("sdk/auth/>", () => {});
    await assert.rejects(wide.ready, (e) => e instanceof HeraldError && e.code === "forbidden");
    await assert.rejects(c.publish("sdk/auth/elsewhere", "x"), (e) => e instanceof HeraldError && e.code === "forbidden");
    await c.ping();
    assert.equal(c.state, "open", "a forbidden request leaves the connection open");
    assert.deepEqual(errors, ["forbidden"], "the refused subscription is also an error event");
    const sent = wire.sent.length;
    wire.sockets.at(-1)?.close();
    await until(() => wire.sockets.length === 2 && c.state === "open", `the reconnect (${tokenIn})`);
    await c.ping();
    const resent = wire.sent.slice(sent).filter((f) => f.op === "sub").map((f) => f.topic);
    assert.deepEqual(resent, [grant], "the refused pattern is not resubscribed");
  }
  for (const tokenIn of /** @type {const} */ (["query", "message"])) {
    const forged = (await token(grant, grant)).slice(0, -4) + "AAAA";
    const c = client(t, { token: forged, tokenIn }, h.ws);
    const states = [];
    const errors = [];
    c.on("state", (s) => states.push(s));
    c.on("error", (e) => errors.push(e.code));
    await until(() => c.state === "closed", `the refusal (${tokenIn})`);
    assert.deepEqual(states.map((s) => [s.state, s.code]), [["open", undefined], ["closed", 4003]], "4003 is final: no reconnect");
    assert.ok(errors.includes("unauthorized") && errors.includes("closed"), `errors: ${errors}`);
  }
});

test("auth: a token refreshed through the callback keeps the connection past the first token's exp", async (t) => {
  const { herald: h, token } = await heraldWithAuth(t);
  const TTL = 3;
  await Promise.all(
    /** @type {const} */ (["query", "message"]).map(async (tokenIn) => {
      const topic = `sdk/auth/refresh/${tokenIn}`;
      const issued = [];
      const tokens = [];
      const wire = tap();
      const c = client(t, {
        tokenIn,
        WebSocket: wire.WebSocket,
        token: async () => {
          issued.push(Date.now());
          tokens.push(await token(topic, topic, TTL));
          return tokens[tokens.length - 1];
        },
      }, h.ws);
      const states = [];
      c.on("state", (s) => states.push(s));
      const got = [];
      await c.subscribe(topic, (m) => got.push(m.data)).ready;
      const firstExpiry = JSON.parse(Buffer.from(tokens[0].split(".")[1], "base64url").toString()).exp * 1000;
      await sleep(firstExpiry - Date.now() + 1500);
      await c.publish(topic, "still here");
      await until(() => got.length === 1, `a message after the first token expired (${tokenIn})`);
      assert.equal(wire.sockets.length, 1, `the same connection (${tokenIn})`);
      assert.deepEqual(states.map((s) => s.state), ["open"], `never closed (${tokenIn}): ${JSON.stringify(states)}`);
      assert.ok(issued.length >= 2, `refreshed (${tokenIn})`);
      assert.ok(issued[1] < firstExpiry, `refreshed before the first exp (${tokenIn})`);
      assert.ok(issued.length <= 10, `refreshed about once per half-life, not in a loop: ${issued.length} tokens (${tokenIn})`);
    }),
  );
});

test("auth: without a refresh herald closes with 4001 and the client reports it", async (t) => {
  const { herald: h, token } = await heraldWithAuth(t);
  const topic = "sdk/auth/lapse";
  const c = client(t, { token: await token(topic, topic, 2), tokenIn: "message" }, h.ws);
  const states = [];
  c.on("state", (s) => states.push(s));
  await c.subscribe(topic, () => {}).ready;
  await until(() => states.some((s) => s.code === 4001), "the expiry close", 6_000);
  const lapsed = states.find((s) => s.code === 4001);
  assert.equal(lapsed?.state, "reconnecting", "4001 is not final: a token callback could supply a fresh token");
  assert.equal(lapsed?.reason, "token expired");
  // This client has only the lapsed token: the reconnect is refused for good.
  await until(() => c.state === "closed", "the refused reconnect");
  assert.equal(states.at(-1)?.code, 4003);
});

test("a publish while herald cannot be reached fails after requestTimeoutMs, with or without ack", async (t) => {
  const port = await freePort(); // nothing listens there
  const c = client(t, { requestTimeoutMs: 300 }, `ws://127.0.0.1:${port}/ws`);
  for (const options of [{}, { ack: /** @type {const} */ (false) }]) {
    const started = Date.now();
    await assert.rejects(c.publish("sdk/offline", "x", options), (e) => e instanceof HeraldError && e.code === "timeout" && /not sent/.test(e.message));
    const took = Date.now() - started;
    assert.ok(took >= 290 && took < 1500, `rejected after ${took} ms`);
  }
  await assert.rejects(c.ping(), (e) => e instanceof HeraldError && e.code === "timeout");
});

test("an AbortSignal ends a publish or ping that waits for the connection or for herald", async (t) => {
  const port = await freePort();
  const offline = client(t, {}, `ws://127.0.0.1:${port}/ws`);
  const controller = new AbortController();
  const waiting = offline.publish("sdk/abort", "x", { signal: controller.signal });
  setTimeout(() => controller.abort("the user went away"), 100);
  await assert.rejects(waiting, (e) => e instanceof HeraldError && e.code === "aborted" && /the user went away/.test(e.message));
  await assert.rejects(offline.ping({ signal: AbortSignal.abort() }), (e) => e instanceof HeraldError && e.code === "aborted");
  // Connected: a publish held by a lossless subscriber without credit is waiting for herald.
  const h = await heraldWith(t, "lossless_hold_timeout_ms = 5000\n");
  const consumer = client(t, {}, h.ws);
  await consumer.subscribe("sdk/abort/held", () => new Promise(() => {}), { policy: "lossless", window: 1 }).ready;
  const publisher = client(t, {}, h.ws);
  await publisher.publish("sdk/abort/held", "1");
  const started = Date.now();
  await assert.rejects(publisher.publish("sdk/abort/held", "2", { signal: AbortSignal.timeout(200) }), (e) => e.code === "aborted");
  assert.ok(Date.now() - started < 2000, "aborted long before herald's hold timeout");
});

test("publish refuses what cannot be sent at once, with the cause, not an error event", async (t) => {
  const c = client(t);
  const errors = [];
  c.on("error", (e) => errors.push(e));
  await c.whenOpen();
  const started = Date.now();
  await assert.rejects(c.publish(123), (e) => e instanceof HeraldError && e.code === "bad_argument" && /topic must be a string/.test(e.message));
  await assert.rejects(c.publish("sdk/bad", undefined), (e) => e.code === "bad_argument");
  await assert.rejects(c.publish("sdk/bad", () => 1), (e) => e.code === "bad_argument");
  await assert.rejects(c.publish("sdk/bad", { n: 1n }), (e) => e.code === "bad_argument" && /JSON/.test(e.message));
  await assert.rejects(c.publish("sdk/bad", "x", { ct: /** @type {any} */ (5) }), (e) => e.code === "bad_argument");
  assert.throws(() => c.subscribe(/** @type {any} */ (7), () => {}), (e) => e instanceof HeraldError && e.code === "bad_argument");
  assert.ok(Date.now() - started < 500, "no timeout involved");
  await c.ping();
  assert.deepEqual(errors, []);
});

test("after close(), subscribe's ready rejects; a subscription waiting for its reply is rejected by close()", async (t) => {
  const port = await freePort();
  const c = client(t, {}, `ws://127.0.0.1:${port}/ws`);
  const waiting = c.subscribe("sdk/closed/a", () => {});
  c.close();
  await assert.rejects(waiting.ready, (e) => e instanceof HeraldError && e.code === "closed");
  const late = c.subscribe("sdk/closed/b", () => {});
  await assert.rejects(late.ready, (e) => e instanceof HeraldError && e.code === "closed");
});

test("a URL whose path herald does not serve (HTTP 404) is reported and not retried", async (t) => {
  const c = client(t, {}, `${herald.ws.replace(/\/ws$/, "")}/not-the-ws-path`);
  const errors = [];
  const states = [];
  c.on("error", (e) => errors.push(e.code));
  c.on("state", (s) => states.push(s.state));
  await until(() => c.state === "closed", "the client to give up");
  assert.deepEqual(errors, ["connect_failed", "not_found"]);
  await sleep(300);
  assert.deepEqual(states, ["closed"], "no retry");
  // A server that is only down is retried, each failure reported.
  const port = await freePort();
  const down = client(t, { minDelayMs: 20, maxDelayMs: 20 }, `ws://127.0.0.1:${port}/ws`);
  const failures = [];
  down.on("error", (e) => failures.push(e.code));
  await until(() => failures.length >= 3, "three reported failures");
  assert.ok(failures.every((f) => f === "connect_failed"), failures.join());
  assert.notEqual(down.state, "closed");
});

test("on, once and off", async (t) => {
  const c = client(t);
  const seen = { on: 0, once: 0, off: 0, removed: 0 };
  c.on("state", () => seen.on++);
  c.once("state", () => seen.once++);
  const offed = () => seen.off++;
  c.on("state", offed);
  c.off("state", offed);
  const remove = c.on("state", () => seen.removed++);
  remove();
  const onceRemoved = () => seen.off++;
  c.once("state", onceRemoved);
  c.off("state", onceRemoved);
  await c.whenOpen();
  c.close();
  assert.deepEqual(seen, { on: 2, once: 1, off: 0, removed: 0 });
});
