// herald-client against a real herald process (HERALD_BIN). Run with
// `node --experimental-websocket --test` (Node 20 has no global WebSocket without the flag).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { connect, HeraldError, topicMatches, encodeBinaryFrame, decodeBinaryFrame } from "../src/herald-client.js";
import { Herald, until } from "./herald.js";

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
  const c = client(t);
  const errors = [];
  c.on("error", (e) => errors.push(e));
  const bad = c.subscribe("sdk/a//b", () => {});
  await assert.rejects(bad.ready, (e) => e instanceof HeraldError && e.code === "invalid_topic");
  await assert.rejects(c.publish("sdk/*/x", "no"), (e) => e instanceof HeraldError && e.code === "publish_to_pattern");
  await assert.rejects(c.publish("", "no"), (e) => e instanceof HeraldError && e.code === "invalid_topic");
  assert.equal(c.patterns.size, 0, "a refused pattern is not resubscribed later");
  assert.deepEqual(errors.map((e) => e.code), ["invalid_topic"], "a refused subscription is also reported as an event");
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
  const c = client(t);
  const got = [];
  const states = [];
  const resubscribed = [];
  c.on("state", (s) => states.push(s.state));
  c.on("resubscribed", (r) => resubscribed.push(r));
  await c.subscribe("sdk/drop/>", (m) => got.push(`${m.topic}#${m.seq}`)).ready;
  await c.publish("sdk/drop/a", "1");
  await until(() => got.length === 1, "the first message");
  const open = until(() => c.state === "open" && states.includes("reconnecting"), "the reconnect");
  c.ws?.close(); // the network goes away under the client
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
  // sdk/drop/b is delivered live if the reconnect beat its publish; otherwise it is not replayed,
  // as `since` cannot name a topic the client never saw (snapshot would bring it).
  await c.publish("sdk/drop/a", "5");
  await until(() => onA().length === 5, "a live message after the reconnect");
});

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
  const c = client(t);
  const got = [];
  c.subscribe("sdk/early", (m) => got.push(m.data)); // before the socket is open
  const ack = await c.publish("sdk/early", "x");
  assert.equal(ack?.seq, 1);
  await until(() => got.length === 1, "the message");
  assert.equal(c.patterns.get("sdk/early")?.size, 1, "subscribed once, not twice");
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

test("lossless: credit goes out only after an async handler finished", async (t) => {
  const c = client(t);
  const errors = [];
  c.on("error", (e) => errors.push(e));
  // Probe whether this herald knows `credit` (issue 5 adds it).
  await c.whenOpen();
  c.ws?.send(JSON.stringify({ op: "credit", topic: "sdk/probe", n: 1 }));
  await c.ping();
  if (!errors.some((e) => e.code === "unknown_op")) {
    t.skip("this herald implements lossless credit; the flow-control test below covers it");
    return;
  }
  errors.length = 0;
  // Today's herald answers `credit` with unknown_op: that error is the observable proof of when
  // the SDK sent it.
  let release = () => {};
  const gate = new Promise((r) => (release = r));
  const seen = [];
  await c.subscribe("sdk/lossless", async (m) => {
    seen.push(m.data);
    await gate;
  }, { policy: "lossless", window: 4 }).ready;
  await c.publish("sdk/lossless", "1");
  await c.publish("sdk/lossless", "2");
  await until(() => seen.length === 1, "the first message");
  await c.ping();
  assert.deepEqual(seen, ["1"], "the second message waits for the first handler");
  assert.deepEqual(errors, [], "no credit while the handler runs");
  release();
  await until(() => seen.length === 2, "the second message");
  await until(() => errors.length >= 1, "the credit to reach herald");
  assert.ok(errors.every((e) => e.code === "unknown_op"));
});

test("lossless flow control against a herald that implements it", { skip: "needs issue 5 (lossless policy and credit on the server), built in parallel" }, () => {});

test("token as ?token= and as an auth op, refreshed before exp", { skip: "needs issue 8 (auth on the server), built in parallel" }, () => {});
