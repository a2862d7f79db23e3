// herald's MQTT (docs/mqtt.md) with mqtt.js, unchanged: over WebSocket (`/mqtt`) and TCP
// (`--mqtt-listen`) in Node, against herald's native WebSocket and HTTP publish, and in headless
// Chromium driven by playwright-core, against a real herald process (HERALD_BIN). Node's global
// WebSocket (the native subscriber) needs --experimental-websocket.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import mqtt from "mqtt";
import { Herald, freePort, until } from "../../clients/js/test/herald.js";
import { CHROMIUM } from "../../clients/js/test/browser.js";
import { pageWith, withTimeout } from "./helpers.js";

/** @type {Herald} */
let herald;
let mqttPort = 0;

before(async () => {
  mqttPort = await freePort();
  herald = await Herald.start(["--mqtt-listen", `127.0.0.1:${mqttPort}`]);
});

after(async () => {
  await herald?.stop();
});

/** Every byte value, twice, NULs and a non-UTF-8 tail. */
const BINARY = Buffer.from([...Array(256).keys(), ...Array(256).keys(), 0, 0, 0xff, 0xfe, 0xc0]);

const wsUrl = () => herald.ws.replace(/\/ws$/, "/mqtt");
const tcpUrl = () => `mqtt://127.0.0.1:${mqttPort}`;

/** A connected mqtt.js client (no reconnects), ended after the test; `got` collects its messages. */
async function connected(t, url, options = {}) {
  const client = mqtt.connect(url, { reconnectPeriod: 0, connectTimeout: 3_000, clean: true, ...options });
  t.after(() => client.endAsync(true));
  const got = [];
  client.on("message", (topic, payload, packet) =>
    got.push({ topic, payload: Buffer.from(payload), qos: packet.qos, retain: packet.retain, properties: packet.properties }),
  );
  const connack = await withTimeout(
    new Promise((resolve, reject) => {
      client.once("connect", resolve);
      client.once("error", reject);
    }),
    "CONNACK",
  );
  return { client, got, connack };
}

/** SUBSCRIBE and its SUBACK; returns the granted QoS of each filter. */
async function subscribe(client, filters, options) {
  const granted = await withTimeout(client.subscribeAsync(filters, options), `SUBACK for ${filters}`);
  return granted.map((g) => g.qos);
}

/** A native herald WebSocket (`/ws`) subscribed to `pattern`; `got` collects its messages. */
async function nativeSubscriber(t, pattern) {
  const ws = new WebSocket(herald.ws);
  ws.binaryType = "arraybuffer";
  t.after(() => ws.close());
  const got = [];
  const replies = [];
  ws.onmessage = (ev) => {
    if (typeof ev.data === "string") {
      const m = JSON.parse(ev.data);
      if (m.op === "msg") got.push({ header: m, text: m.data });
      else replies.push(m);
    } else {
      const buf = Buffer.from(ev.data);
      const n = buf.readUInt32BE(0);
      got.push({ header: JSON.parse(buf.subarray(4, 4 + n).toString("utf8")), binary: buf.subarray(4 + n) });
    }
  };
  await withTimeout(new Promise((resolve, reject) => ((ws.onopen = resolve), (ws.onerror = reject))), "WebSocket open");
  ws.send(JSON.stringify({ op: "sub", id: 1, topic: pattern }));
  await until(() => replies.some((r) => r.op === "subscribed" && r.id === 1), () => `subscribed, got ${JSON.stringify(replies)}`, 3_000);
  return { ws, got, replies };
}

for (const protocolVersion of [4, 5]) {
  test(`mqtt.js in Node over WebSocket, MQTT ${protocolVersion === 4 ? "3.1.1" : "5.0"}: a/# QoS 1 gets binary QoS 0 and 1 publishes byte for byte, in order, once`, async (t) => {
    const { client: sub, got, connack } = await connected(t, wsUrl(), { protocolVersion });
    assert.equal(connack.sessionPresent, false);
    assert.deepEqual(await subscribe(sub, "a/#", { qos: 1 }), [1]);
    const { client: pub } = await connected(t, wsUrl(), { protocolVersion });
    const big = randomBytes(64 * 1024);
    const sent = [
      ["a/bin", BINARY, 0],
      ["a/bin", BINARY, 1],
      ["a/big/x", big, 0],
      ["a/big/x", big, 1],
      ["a", Buffer.from("parent level"), 1],
      ["a", Buffer.alloc(0), 0],
      ["a/bin", Buffer.from([0]), 1],
    ];
    for (const [topic, payload, qos] of sent) await withTimeout(pub.publishAsync(topic, payload, { qos }), `publish ${topic}`);
    // Not matched by a/#: must not arrive.
    await withTimeout(pub.publishAsync("ab", "no", { qos: 1 }), "publish ab");
    await withTimeout(pub.publishAsync("b/a", "no", { qos: 1 }), "publish b/a");
    await withTimeout(pub.publishAsync("a/end", "end", { qos: 1 }), "publish a/end");
    await until(() => got.some((m) => m.topic === "a/end"), () => `a/end, got ${got.map((m) => m.topic)}`, 5_000);
    await new Promise((r) => setTimeout(r, 200)); // duplicates would show up here
    assert.deepEqual(
      got.map((m) => m.topic),
      [...sent.map(([topic]) => topic), "a/end"],
    );
    sent.forEach(([topic, payload, qos], i) => {
      assert.ok(got[i].payload.equals(payload), `message ${i} (${topic}, ${payload.length} bytes): ${got[i].payload.length} bytes differ`);
      // docs/mqtt.md: each message goes at the lower of its publish QoS and the grant (1); live
      // messages carry retain 0.
      assert.equal(got[i].qos, qos, `message ${i} QoS`);
      assert.equal(got[i].retain, false, `message ${i} retain`);
    });
  });
}

test("mqtt.js in Node over TCP: a retained message reaches a later subscriber with retain set; an empty retained payload clears it", async (t) => {
  const { client: pub } = await connected(t, tcpUrl(), { protocolVersion: 4 });
  await withTimeout(pub.publishAsync("r/state", BINARY, { qos: 1, retain: true }), "retained publish");
  await withTimeout(pub.publishAsync("r/other", "not retained", { qos: 1 }), "plain publish");

  for (const protocolVersion of [4, 5]) {
    const { client: late, got } = await connected(t, tcpUrl(), { protocolVersion });
    assert.deepEqual(await subscribe(late, "r/#", { qos: 1 }), [1]);
    await until(() => got.length >= 1, "the retained message", 3_000);
    assert.equal(got[0].topic, "r/state");
    assert.ok(got[0].payload.equals(BINARY), "retained payload byte for byte");
    assert.equal(got[0].retain, true);
    assert.equal(got[0].qos, 1);
  }

  const { client: live, got: liveGot } = await connected(t, tcpUrl(), { protocolVersion: 5 });
  await subscribe(live, "r/#", { qos: 1 });
  await until(() => liveGot.length === 1, "the retained message", 3_000);
  // A live retained publish is forwarded with retain 0; the empty one clears the topic.
  await withTimeout(pub.publishAsync("r/state", "", { qos: 1, retain: true }), "empty retained publish");
  await until(() => liveGot.length === 2, () => `the live empty message, got ${liveGot.length}`, 3_000);
  assert.equal(liveGot[1].topic, "r/state");
  assert.equal(liveGot[1].payload.length, 0);
  assert.equal(liveGot[1].retain, false);

  const { client: later, got: laterGot } = await connected(t, tcpUrl(), { protocolVersion: 4 });
  await subscribe(later, "r/#", { qos: 1 });
  await withTimeout(pub.publishAsync("r/sync", "sync", { qos: 1 }), "sync publish");
  await until(() => laterGot.some((m) => m.topic === "r/sync"), "r/sync", 3_000);
  assert.deepEqual(
    laterGot.map((m) => [m.topic, m.retain]),
    [["r/sync", false]],
    "nothing retained is left",
  );
});

test("cross-protocol: a native /ws subscriber gets mqtt.js publishes; an HTTP publish reaches an mqtt.js subscriber", async (t) => {
  const native = await nativeSubscriber(t, "x/>");
  const { client: pub } = await connected(t, wsUrl(), { protocolVersion: 5 });
  await withTimeout(pub.publishAsync("x/bin", BINARY, { qos: 1, properties: { contentType: "application/octet-stream" } }), "binary publish");
  await withTimeout(pub.publishAsync("x/text", "héllo", { qos: 1, properties: { payloadFormatIndicator: true } }), "UTF-8 publish");
  await withTimeout(pub.publishAsync("x//z", "empty level", { qos: 0, properties: { payloadFormatIndicator: true } }), "publish x//z");
  await until(() => native.got.length >= 3, () => `3 native messages, got ${native.got.length}`, 3_000);
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(native.got.length, 3);
  const [bin, text, empty] = native.got;
  assert.equal(bin.header.op, "msg");
  assert.equal(bin.header.topic, "x/bin");
  assert.equal(bin.header.ct, "application/octet-stream");
  assert.ok(bin.binary?.equals(BINARY), "binary frame payload byte for byte");
  assert.equal(text.header.topic, "x/text");
  assert.equal(text.text, "héllo");
  assert.equal(empty.header.topic, "x/+/z", "MQTT's empty level is + for native clients");
  assert.equal(empty.text, "empty level");
  assert.ok(text.header.seq > 0 && text.header.epoch.length > 0, "numbered like any herald message");

  const { client: sub, got } = await connected(t, tcpUrl(), { protocolVersion: 4 });
  assert.deepEqual(await subscribe(sub, "x/#", { qos: 1 }), [1]);
  assert.equal((await herald.publishHttp("x/y", BINARY, "application/octet-stream")).status, 200);
  assert.equal((await herald.publishHttp("x/y", "over HTTP")).status, 200);
  await until(() => got.length === 2, () => `2 MQTT messages, got ${got.length}`, 3_000);
  assert.equal(got[0].topic, "x/y");
  assert.ok(got[0].payload.equals(BINARY), "HTTP binary body byte for byte");
  assert.equal(got[1].topic, "x/y");
  assert.equal(got[1].payload.toString(), "over HTTP");
});

test("mqtt.js shared subscription: two clients on /mqtt share $share/web/jobs/#, each message to one of them in turn", async (t) => {
  const members = [];
  for (const protocolVersion of [5, 4]) {
    const member = await connected(t, wsUrl(), { protocolVersion });
    if (protocolVersion === 5) assert.equal(member.connack.properties?.sharedSubscriptionAvailable, true);
    assert.deepEqual(await subscribe(member.client, "$share/web/jobs/#", { qos: 1 }), [1]);
    members.push(member);
  }
  const { client: pub } = await connected(t, tcpUrl(), { protocolVersion: 5 });
  const sent = Array.from({ length: 10 }, (_, i) => `job ${i}`);
  for (const job of sent) await withTimeout(pub.publishAsync("jobs/x", job, { qos: 1 }), `publish ${job}`);
  await until(
    () => members[0].got.length + members[1].got.length === sent.length,
    () => `${sent.length} messages, got ${members.map((m) => m.got.length)}`,
    3_000,
  );
  await new Promise((r) => setTimeout(r, 200)); // duplicates would show up here
  members.forEach((m, k) =>
    assert.deepEqual(
      m.got.map((g) => g.payload.toString()),
      sent.filter((_, i) => i % 2 === k),
      `member ${k} takes every other message, in order`,
    ),
  );
});

const skip = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM}`;

test("mqtt.js in headless Chromium: connects on /mqtt, subscribes, receives binary and text from Node", { skip }, async (t) => {
  const { page, problems } = await pageWith(t, herald.http, "node_modules/mqtt/dist/mqtt.min.js");
  const granted = await page.evaluate(
    (url) =>
      new Promise((resolve, reject) => {
        window.got = [];
        const client = mqtt.connect(url, { protocolVersion: 5, reconnectPeriod: 0, connectTimeout: 3_000 });
        client.on("message", (topic, payload, packet) => window.got.push({ topic, bytes: Array.from(payload), qos: packet.qos }));
        client.on("error", (e) => reject(new Error(e.message)));
        client.on("connect", () =>
          client.subscribe("browser/mqtt/#", { qos: 1 }, (err, granted) => (err ? reject(new Error(err.message)) : resolve(granted.map((g) => g.qos)))),
        );
        window.client = client;
      }),
    wsUrl(),
  );
  assert.deepEqual(granted, [1]);
  const { client: pub } = await connected(t, wsUrl(), { protocolVersion: 4 });
  await withTimeout(pub.publishAsync("browser/mqtt/bin", BINARY, { qos: 1 }), "binary publish");
  await withTimeout(pub.publishAsync("browser/mqtt/text", "Hello World!", { qos: 0 }), "text publish");
  await page.waitForFunction(() => window.got.length === 2, null, { timeout: 3_000 });
  const got = await page.evaluate(() => window.got);
  assert.equal(got[0].topic, "browser/mqtt/bin");
  assert.ok(Buffer.from(got[0].bytes).equals(BINARY), "binary payload byte for byte in the page");
  assert.equal(got[0].qos, 1);
  assert.equal(got[1].topic, "browser/mqtt/text");
  assert.equal(Buffer.from(got[1].bytes).toString(), "Hello World!");
  assert.deepEqual(problems, []);
  await page.evaluate(() => new Promise((resolve) => window.client.end(false, resolve)));
});
