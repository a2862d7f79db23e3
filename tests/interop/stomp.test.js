// herald's STOMP over WebSocket (`/stomp`, docs/stomp.md) with @stomp/stompjs, unchanged, in
// Node (its global WebSocket: run with --experimental-websocket) and in headless Chromium
// driven by playwright-core, against a real herald process (HERALD_BIN).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { Client } from "@stomp/stompjs";
import { Herald, until } from "../../clients/js/test/herald.js";
import { CHROMIUM } from "../../clients/js/test/browser.js";
import { pageWith, withTimeout } from "./helpers.js";

/** @type {Herald} */
let herald;

before(async () => {
  herald = await Herald.start();
});

after(async () => {
  await herald?.stop();
});

/** Every byte value, and NULs where a STOMP frame would end without content-length. */
const BINARY = Uint8Array.from([...Array(256).keys(), 0, 0, 101, 110, 100, 0]);

/** A connected stompjs client on herald's /stomp; its ERROR frames are collected. */
async function connected(t, connectHeaders = {}) {
  const errors = [];
  const client = new Client({
    brokerURL: herald.ws.replace(/\/ws$/, "/stomp"),
    connectHeaders,
    reconnectDelay: 0,
    heartbeatIncoming: 0,
    heartbeatOutgoing: 0,
  });
  client.onStompError = (frame) => errors.push(frame);
  const up = new Promise((resolve, reject) => {
    client.onConnect = resolve;
    client.onWebSocketError = reject;
  });
  client.activate();
  t.after(() => client.deactivate());
  const frame = await withTimeout(up, "CONNECTED");
  return { client, errors, frame };
}

/** Publishes with a receipt and waits for it. */
function publishWithReceipt(client, destination, params) {
  const receipt = `r-${Math.random().toString(36).slice(2)}`;
  const got = new Promise((resolve) => client.watchForReceipt(receipt, resolve));
  client.publish({ destination, ...params, headers: { receipt, ...(params.headers ?? {}) } });
  return withTimeout(got, `RECEIPT ${receipt}`);
}

test("stompjs in Node: STOMP 1.2 negotiated on v12.stomp, binary bodies byte for byte", async (t) => {
  const { client: sub, frame } = await connected(t);
  assert.equal(frame.headers.version, "1.2");
  assert.equal(sub.webSocket.protocol, "v12.stomp");
  assert.match(frame.headers.server, /^herald\//);
  const { client: pub } = await connected(t);
  const got = [];
  sub.subscribe("/topic/js/bin", (m) => got.push(m), { id: "s1" });
  await publishWithReceipt(sub, "/topic/js/sync", { body: "x" }); // the SUBSCRIBE is in place
  await publishWithReceipt(pub, "/topic/js/bin", { binaryBody: BINARY, headers: { "content-type": "application/octet-stream" } });
  await publishWithReceipt(pub, "/topic/js/bin", { body: "text é" });
  await until(() => got.length === 2, () => `2 messages, got ${got.length}`, 3_000);
  assert.deepEqual(new Uint8Array(got[0].binaryBody), BINARY);
  assert.equal(got[0].headers["content-type"], "application/octet-stream");
  assert.equal(got[0].headers.destination, "/topic/js/bin");
  assert.equal(got[1].body, "text é");
  assert.equal(Number(got[1].headers.seq), Number(got[0].headers.seq) + 1);
});

test("stompjs in Node: client-individual acks give credit back; HTTP publishes arrive in order", async (t) => {
  const { client } = await connected(t);
  const got = [];
  client.subscribe("/topic/js/credit", (m) => got.push(m), { id: "s", ack: "client-individual", "prefetch-count": "2" });
  await publishWithReceipt(client, "/topic/js/sync", { body: "x" });
  for (let i = 0; i < 2; i++) assert.equal((await herald.publishHttp("js/credit", `m${i}`)).status, 200);
  // Out of credit: herald holds the next publishes until the subscriber acknowledges.
  // One after the other: two requests in flight at once have no order.
  const held = (async () => [await herald.publishHttp("js/credit", "m2"), await herald.publishHttp("js/credit", "m3")])();
  await until(() => got.length === 2, "2 messages", 3_000);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(got.length, 2, "out of credit: the rest wait");
  got[0].ack();
  got[1].ack();
  await until(() => got.length === 4, "4 messages", 3_000);
  assert.deepEqual(got.map((m) => m.body), ["m0", "m1", "m2", "m3"]);
  for (const r of await held) assert.equal(r.status, 200);
});

test("stompjs in Node: resubscribing with since after a reconnect replays what was missed, then live", async (t) => {
  const got = [];
  const receipts = [];
  let since = null; // the position of the last message processed: `<seq>@<epoch>`
  const client = new Client({
    brokerURL: herald.ws.replace(/\/ws$/, "/stomp"),
    reconnectDelay: 0,
    heartbeatIncoming: 0,
    heartbeatOutgoing: 0,
  });
  // As an application resumes: every (re)connect subscribes from where it left off.
  client.onConnect = () => {
    const receipt = `sub-${receipts.length}`;
    client.watchForReceipt(receipt, (frame) => receipts.push(frame.headers));
    const onMessage = (m) => {
      got.push(m.body);
      since = `${m.headers.seq}@${m.headers.epoch}`;
    };
    client.subscribe("/topic/js/resume", onMessage, { id: "s", receipt, ...(since ? { since } : {}) });
  };
  client.activate();
  t.after(() => client.deactivate());
  await until(() => receipts.length === 1, "the first RECEIPT", 3_000);
  for (const m of ["m0", "m1"]) assert.equal((await herald.publishHttp("js/resume", m)).status, 200);
  await until(() => got.length === 2, () => `2 messages, got ${got.length}`, 3_000);

  await client.deactivate();
  for (const m of ["m2", "m3"]) assert.equal((await herald.publishHttp("js/resume", m)).status, 200);
  client.activate();
  await until(() => receipts.length === 2, "the RECEIPT of the resubscription", 3_000);
  assert.equal(receipts[1].replayed, "2");
  assert.equal(receipts[1].gap, undefined);
  assert.equal((await herald.publishHttp("js/resume", "live")).status, 200);
  await until(() => got.length === 5, () => `5 messages, got ${got.length}`, 3_000);
  await new Promise((r) => setTimeout(r, 300));
  assert.deepEqual(got, ["m0", "m1", "m2", "m3", "live"]);
});

test("stompjs in Node: a refused destination is an ERROR naming the frame's receipt", async (t) => {
  const { client, errors } = await connected(t);
  const closed = new Promise((resolve) => (client.onWebSocketClose = resolve));
  client.subscribe("/queue/jobs", () => {}, { id: "q", receipt: "sub-q" });
  await withTimeout(closed, "the close");
  assert.equal(errors.length, 1);
  assert.equal(errors[0].headers["receipt-id"], "sub-q");
  assert.match(errors[0].headers.message, /topics only/);
});

const skip = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM}`;

test("stompjs in headless Chromium: subscribes on /stomp and receives binary and text", { skip }, async (t) => {
  const { page, problems } = await pageWith(t, herald.http, "node_modules/@stomp/stompjs/bundles/stomp.umd.min.js");
  await page.evaluate((url) => {
    window.got = [];
    return new Promise((resolve, reject) => {
      const client = new StompJs.Client({ brokerURL: url, reconnectDelay: 0 });
      client.onConnect = (frame) => {
        client.subscribe("/topic/browser/feed", (m) => {
          window.got.push({ binary: Array.from(m.binaryBody), headers: m.headers });
        });
        client.watchForReceipt("ready", () => resolve(frame.headers.version));
        client.publish({ destination: "/topic/browser/sync", body: "x", headers: { receipt: "ready" } });
      };
      client.onStompError = (f) => reject(new Error(f.headers.message));
      client.onWebSocketError = () => reject(new Error("WebSocket error"));
      client.activate();
      window.client = client;
    });
  }, herald.ws.replace(/\/ws$/, "/stomp"));
  assert.equal((await herald.publishHttp("browser/feed", BINARY, "application/octet-stream")).status, 200);
  assert.equal((await herald.publishHttp("browser/feed", "Hello World!")).status, 200);
  await page.waitForFunction(() => window.got.length === 2, null, { timeout: 3_000 });
  const got = await page.evaluate(() => window.got);
  assert.deepEqual(Uint8Array.from(got[0].binary), BINARY);
  assert.equal(got[0].headers["content-type"], "application/octet-stream");
  assert.equal(Buffer.from(got[1].binary).toString(), "Hello World!");
  assert.deepEqual(problems, []);
  await page.evaluate(() => window.client.deactivate());
});
