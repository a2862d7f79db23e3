// Latency view: the page publishes probes carrying its send time (µs since the UNIX epoch) with
// `stamp`, subscribes to them, and splits each round into publish→server (herald's stamp minus
// the send time) and server→browser (arrival minus the stamp), the two legs of the latency
// seeds. Any stamped message on the probe topic counts for server→browser, so an external
// prober works too; publish→server and the total count only this page's probes (their send time
// is this page's clock).
//
// Every page probes the same topic unless told otherwise: herald never forgets a topic, so a
// topic per visit would leave one behind each time. Probing and the subscription stop while the
// view is hidden.

import { histogram } from "./chart.js";
import { count, micros, cell } from "./format.js";
import { release } from "./api.js";

const KEEP = 2000;
const PROBE_TOPIC = "herald/probe/dashboard";
/** Tells this page's probes from other pages'. */
const PAGE = Math.random().toString(36).slice(2, 10);
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));

/** @type {import("./herald-client.js").HeraldClient} */
let client;
/** @type {import("./herald-client.js").Subscription | null} */
let sub = null;
/** @type {{up: number[], down: number[], total: number[]}} */
let samples = { up: [], down: [], total: [] };
let running = true;
let timer = 0;
let visible = false;

/** Wall-clock microseconds, with the sub-millisecond part performance.now() gives. */
const nowUs = () => Math.round((performance.timeOrigin + performance.now()) * 1000);

/** @param {import("./herald-client.js").HeraldClient} c */
export function init(c) {
  client = c;
  const topic = /** @type {HTMLInputElement} */ ($("lat-topic"));
  topic.value = PROBE_TOPIC;
  topic.addEventListener("change", subscribe);
  $("lat-rate").addEventListener("change", schedule);
  $("lat-toggle").addEventListener("click", () => {
    running = !running;
    $("lat-toggle").textContent = running ? "Stop" : "Start";
    schedule();
  });
  $("lat-reset").addEventListener("click", () => {
    samples = { up: [], down: [], total: [] };
    render();
  });
  setInterval(render, 500);
}

export function show() {
  visible = true;
  subscribe();
  schedule();
  render();
}

/** Probing stops while the view is hidden: no load on herald nobody is looking at. */
export function hide() {
  visible = false;
  clearInterval(timer);
  release(sub);
  sub = null;
}

function subscribe() {
  release(sub);
  sub = client.subscribe(/** @type {HTMLInputElement} */ ($("lat-topic")).value.trim(), onProbe);
}

function schedule() {
  clearInterval(timer);
  if (!running || !visible) return;
  const rate = Math.min(1000, Math.max(1, Number(/** @type {HTMLInputElement} */ ($("lat-rate")).value) || 20));
  timer = setInterval(probe, 1000 / rate);
}

function probe() {
  if (client.state !== "open" || !sub) return;
  client.publish(sub.pattern, JSON.stringify({ t: nowUs(), page: PAGE }), { stamp: true, ack: false }).catch(() => {});
}

/** @param {import("./herald-client.js").Message} m */
function onProbe(m) {
  const arrived = nowUs();
  if (m.ts === undefined) return;
  add(samples.down, arrived - m.ts);
  try {
    const { t: sent, page } = m.json();
    if (typeof sent === "number" && page === PAGE) {
      add(samples.up, m.ts - sent);
      add(samples.total, arrived - sent);
    }
  } catch {
    // a stamped message without a send time: only the server→browser leg
  }
}

/** @param {number[]} a @param {number} v */
function add(a, v) {
  a.push(v);
  if (a.length > KEEP) a.shift();
}

/** @param {number[]} sorted @param {number} q */
const pct = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];

function render() {
  const rows = [["publish → server", samples.up], ["server → browser", samples.down], ["total", samples.total]].map(([name, values]) => {
    const s = [.../** @type {number[]} */ (values)].sort((a, b) => a - b);
    const tr = document.createElement("tr");
    const q = (/** @type {number} */ p) => cell(s.length ? micros(pct(s, p)) : "–", "n");
    tr.append(cell(/** @type {string} */ (name)), cell(count(s.length), "n"), q(0.5), q(0.9), q(0.99), cell(s.length ? micros(s[s.length - 1]) : "–", "n"));
    return tr;
  });
  $("lat-body").replaceChildren(...rows);
  if (visible) {
    histogram(/** @type {HTMLCanvasElement} */ ($("lat-chart")), [
      { values: samples.up, color: "--in" },
      { values: samples.down, color: "--out" },
    ]);
  }
}
