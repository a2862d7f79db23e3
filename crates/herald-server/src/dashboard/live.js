// Live view: watch a pattern. The handler only counts and keeps the newest messages in a ring;
// the table is redrawn at most four times a second with at most ROWS rows, so 10,000 msg/s cost
// the page a counter increment each, not a DOM update each. What was never on screen is counted
// as "not shown".

import { count, bytes, cell } from "./format.js";
import { topicMatches } from "./herald-client.js";

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
let pendingWatch = "";

/** @param {import("./herald-client.js").HeraldClient} c */
export function init(c) {
  client = c;
  $("l-form").addEventListener("submit", (e) => {
    e.preventDefault();
    watch(/** @type {HTMLInputElement} */ ($("l-pattern")).value.trim());
  });
  $("l-pause").addEventListener("click", () => {
    paused = !paused;
    $("l-pause").textContent = paused ? "Resume" : "Pause";
  });
  $("l-clear").addEventListener("click", () => {
    ring = [];
    received = skipped = dropped = unrendered = 0;
    draw(true);
  });
  client.on("dropped", (d) => {
    if (sub && topicMatches(sub.pattern, d.topic)) dropped += d.count;
  });
  $("p-form").addEventListener("submit", publish);
  watch(pendingWatch || /** @type {HTMLInputElement} */ ($("l-pattern")).value.trim());
  setInterval(() => draw(false), REDRAW_MS);
}

/** Subscribes the view to `pattern` (replacing the previous one). @param {string} pattern */
export function watch(pattern) {
  if (!client) {
    pendingWatch = pattern; // init runs when the view is first shown
    return;
  }
  /** @type {HTMLInputElement} */ ($("l-pattern")).value = pattern;
  sub?.unsubscribe();
  ring = [];
  received = skipped = dropped = unrendered = 0;
  sub = client.subscribe(pattern, onMessage);
  sub.ready.catch((e) => {
    $("l-body").replaceChildren(row([cell(`cannot watch ${pattern}: ${e.message}`)]));
  });
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
    const time = new Date(arrival.get(m) ?? Date.now()).toISOString().slice(11, 23);
    const data = typeof m.data === "string" ? m.data.slice(0, 300) : `‹${bytes(m.data.byteLength)}›`;
    rows.push(row([cell(time), cell(m.topic), cell(String(m.seq), "n"), cell(m.ct ?? (typeof m.data === "string" ? "text" : "binary")), cell(data)]));
  }
  $("l-body").replaceChildren(...rows);
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
  try {
    const ack = await client.publish(topic, data, { ct, stamp: true });
    out.textContent = `published ${ack?.topic} #${ack?.seq}`;
  } catch (err) {
    out.textContent = `refused: ${/** @type {Error} */ (err).message}`;
  }
}
