// Overview: gauges and counter rates from GET /api/stats, once a second, with a chart of the
// last five minutes (kept in the page, so it starts empty on load).

import { lineChart } from "./chart.js";
import { count, bytes, duration, fillKv } from "./format.js";
import { showCluster } from "./cluster.js";

const CAPACITY = 300; // one sample per second
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
/** @type {{in: number[], out: number[]}} */
const history = { in: [], out: [] };
/** @type {any} */
let previous = null;
let timer = 0;
let visible = false;

export function init() {
  poll();
  addEventListener("resize", draw);
}

export function show() {
  visible = true;
  draw();
}

export function hide() {
  visible = false;
}

async function poll() {
  clearTimeout(timer);
  try {
    const r = await fetch("/api/stats");
    if (r.ok) update(await r.json());
  } catch {
    // herald is restarting: the connection pill says so; try again
  }
  timer = setTimeout(poll, 1000);
}

/** @param {any} s */
function update(s) {
  $("s-connections").textContent = count(s.connections);
  $("s-subscriptions").textContent = count(s.subscriptions);
  $("s-topics").textContent = count(s.topics);
  $("s-uptime").textContent = duration(s.uptime_secs);
  if (previous && s.now_us > previous.now_us && s.uptime_secs >= previous.uptime_secs) {
    const dt = (s.now_us - previous.now_us) / 1e6;
    const rate = (/** @type {string} */ k) => Math.max(0, (s[k] - previous[k]) / dt);
    $("s-in-rate").textContent = count(rate("messages_in"));
    $("s-out-rate").textContent = count(rate("deliveries"));
    $("s-bin-rate").textContent = bytes(rate("bytes_in")) + "/s";
    $("s-bout-rate").textContent = bytes(rate("bytes_out")) + "/s";
    push(history.in, rate("messages_in"));
    push(history.out, rate("deliveries"));
  }
  previous = s;
  fillKv($("s-dropped"), s.dropped);
  fillKv($("s-disconnects"), s.disconnects);
  fillKv($("s-errors"), s.errors);
  showCluster(s.cluster ?? null, s.now_us);
  draw();
}

/** @param {number[]} a @param {number} v */
function push(a, v) {
  a.push(v);
  if (a.length > CAPACITY) a.shift();
}

function draw() {
  if (!visible) return;
  lineChart(/** @type {HTMLCanvasElement} */ ($("rate-chart")), [
    { values: history.in, color: "--in" },
    { values: history.out, color: "--out" },
  ], { capacity: CAPACITY, format: count });
}
