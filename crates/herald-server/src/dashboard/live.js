// Live view: watch a pattern. The handler only counts and keeps the newest messages in a ring;
// the table is redrawn at most four times a second with at most ROWS rows, so 10,000 msg/s cost
// the page a counter increment each, not a DOM update each. What was never on screen is counted
// as "not shown".
//
// The subscription uses the `drop` policy and exists only while the view is shown: a fast
// stream the page cannot keep up with costs messages (counted, with herald's drop notices),
// never the page's connection, which the other views share.

import { count, bytes, cell } from "./format.js";
import { topicMatches } from "./herald-client.js";
import { release } from "./api.js";

const ROWS = 100;
const REDRAW_MS = 250;
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

/** @type {import("./herald-client.js").HeraldClient} */
let client;
/** @type {import("./herald-client.js").Subscription | null} */
let sub = null;
/** The newest messages, oldest first. @type {import("./herald-client.js").Message[]} */
let ring = [];
let received = 0, skipped = 0, dropped = 0, unrendered = 0, paused = false;
/** Messages counted since `windowStart`, for the rate. */
let windowStart = performance.now(), windowCount = 0, rate = 0;
/** Arrival time of each message in the ring. @type {WeakMap<import("./herald-client.js").Message, number>} */
const arrival = new WeakMap();
let visible = false;

/** @param {import("./herald-client.js").HeraldClient} c */
export function init(c) {
  client = c;
  $("l-form").addEventListener("submit", (e) => {
    e.preventDefault();
    release(sub);
    sub = null; // a new Watch starts afresh, even on the same pattern
    subscribe();
  });
  $("l-pause").addEventListener("click", () => {
    paused = !paused;
    $("l-pause").textContent = paused ? "Resume" : "Pause";
  });
  $("l-clear").addEventListener("click", () => {
    reset();
    draw(true);
  });
  client.on("dropped", (d) => {
    if (sub && topicMatches(sub.pattern, d.topic)) dropped += d.count;
  });
  $("p-form").addEventListener("submit", publish);
  setInterval(() => draw(false), REDRAW_MS);
}

export function show() {
  visible = true;
  subscribe();
}

export function hide() {
  visible = false;
  release(sub);
  sub = null;
}

/** Watches `pattern` (replacing the previous one) from when the view is shown.
 * @param {string} pattern */
export function watch(pattern) {
  /** @type {HTMLInputElement} */ ($("l-pattern")).value = pattern;
  if (visible) subscribe();
}

function subscribe() {
  const pattern = /** @type {HTMLInputElement} */ ($("l-pattern")).value.trim();
  if (sub?.pattern === pattern) return;
  release(sub);
  reset();
  draw(true);
  sub = client.subscribe(pattern, onMessage, { policy: "drop" });
  sub.ready.catch((e) => {
    $("l-body").replaceChildren(row([cell(`cannot watch ${pattern}: ${e.message}`)]));
  });
}

/** Empties the table and the counters, the rate included. */
function reset() {
  ring = [];
  received = skipped = dropped = unrendered = 0;
  windowStart = performance.now();
  windowCount = rate = 0;
}

/** @param {import("./herald-client.js").Message} m */
function onMessage(m) {
  received++;
  windowCount++;
  if (paused) {
    skipped++;
    return;
  }
  arrival.set(m, Date.now());
  ring.push(m);
  unrendered++;
  if (ring.length > ROWS * 2) ring = ring.slice(-ROWS);
}

/** @param {boolean} force */
function draw(force) {
  const now = performance.now();
  if (now - windowStart >= 1000) {
    rate = (windowCount * 1000) / (now - windowStart);
    windowStart = now;
    windowCount = 0;
  }
  if (unrendered > ROWS) skipped += unrendered - ROWS; // arrived and left the ring between redraws
  const fresh = unrendered > 0;
  unrendered = 0;
  if (ring.length > ROWS) ring = ring.slice(-ROWS);
  $("l-received").textContent = count(received);
  $("l-rate").textContent = count(rate);
  $("l-skipped").textContent = count(skipped);
  $("l-dropped").textContent = count(dropped);
  if (!fresh && !force) return;
  const rows = [];
  for (let i = ring.length - 1; i >= 0; i--) {
    const m = ring[i];
    const time = clock(arrival.get(m) ?? Date.now());
    const data = typeof m.data === "string" ? m.data.slice(0, 300) : `‹${bytes(m.data.byteLength)}›`;
    rows.push(row([cell(time), cell(m.topic), cell(String(m.seq), "n"), cell(m.ct ?? (typeof m.data === "string" ? "text" : "binary")), cell(data)]));
  }
  $("l-body").replaceChildren(...rows);
}

/** Local time of day with milliseconds, as the column header says. @param {number} ms */
function clock(ms) {
  const d = new Date(ms);
  return `${d.toLocaleTimeString("en-GB", { hour12: false })}.${String(d.getMilliseconds()).padStart(3, "0")}`;
}

/** @param {HTMLElement[]} cells */
function row(cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

/** @param {Event} e */
async function publish(e) {
  e.preventDefault();
  const topic = /** @type {HTMLInputElement} */ ($("p-topic")).value.trim();
  const data = /** @type {HTMLTextAreaElement} */ ($("p-data")).value;
  const ct = /** @type {HTMLSelectElement} */ ($("p-ct")).value;
  const out = $("p-result");
  if (ct === "application/json") {
    try {
      JSON.parse(data);
    } catch (err) {
      out.textContent = `not sent: not valid JSON (${/** @type {Error} */ (err).message})`;
      return;
    }
  }
  try {
    const ack = await client.publish(topic, data, { ct, stamp: true });
    out.textContent = `published ${ack?.topic} #${ack?.seq}`;
  } catch (err) {
    out.textContent = `refused: ${/** @type {Error} */ (err).message}`;
  }
}
