// Overview: gauges and counter rates from GET /api/stats, once a second, with a chart of the
// last five minutes. herald keeps that chart's samples itself (GET /api/stats/history), so the
// chart is full on load; the page appends its own samples and asks for the history again after
// it could not reach herald. The time axis is wall-clock time: an outage shows as a gap.

import { lineChart } from "./chart.js";
import { count, bytes, duration, fillKv } from "./format.js";
import { showCluster } from "./cluster.js";
import { api, ApiError } from "./api.js";

const WINDOW_US = 300e6;
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
/** Counter samples, oldest first. @typedef {{now_us: number, messages_in: number, deliveries: number, bytes_in: number, bytes_out: number}} Sample */
/** @type {Sample[]} */
let samples = [];
let needHistory = true;
/** When herald stopped answering (ms), or 0. */
let unreachableSince = 0;
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
    if (needHistory) {
      const h = await api("/api/stats/history");
      merge(h.samples);
      needHistory = false;
    }
    update(await api("/api/stats"));
    unreachableSince = 0;
  } catch (e) {
    // herald is restarting, unreachable, or refused (the login form says why): numbers from
    // before would be stale, so none are shown.
    unreachableSince ||= Date.now();
    needHistory = true;
    for (const el of document.querySelectorAll("#overview .card .value")) el.textContent = "–";
    $("rate-status").textContent = e instanceof ApiError
      ? e.message
      : `herald not reachable since ${new Date(unreachableSince).toLocaleTimeString()}`;
    draw();
  }
  timer = setTimeout(poll, 1000);
}

/** Adds samples (any order, possibly repeated) and keeps the last five minutes.
 * @param {Sample[]} more */
function merge(more) {
  const byTime = new Map([...samples, ...more].map((s) => [s.now_us, s]));
  samples = [...byTime.values()].sort((a, b) => a.now_us - b.now_us);
  const from = samples.length ? samples[samples.length - 1].now_us - WINDOW_US : 0;
  samples = samples.filter((s) => s.now_us >= from);
}

/** @param {any} s */
function update(s) {
  $("rate-status").textContent = "";
  const prev = samples[samples.length - 1];
  merge([s]);
  $("s-connections").textContent = count(s.connections);
  $("s-subscriptions").textContent = count(s.subscriptions);
  $("s-topics").textContent = count(s.topics);
  $("s-uptime").textContent = duration(s.uptime_secs);
  const dt = prev ? (s.now_us - prev.now_us) / 1e6 : 0;
  const rate = (/** @type {keyof Sample} */ k) => (dt > 0 && s[k] >= prev[k] ? (s[k] - prev[k]) / dt : NaN);
  $("s-in-rate").textContent = count(rate("messages_in"));
  $("s-out-rate").textContent = count(rate("deliveries"));
  $("s-bin-rate").textContent = Number.isNaN(rate("bytes_in")) ? "–" : bytes(rate("bytes_in")) + "/s";
  $("s-bout-rate").textContent = Number.isNaN(rate("bytes_out")) ? "–" : bytes(rate("bytes_out")) + "/s";
  fillKv($("s-dropped"), s.dropped);
  fillKv($("s-disconnects"), s.disconnects);
  fillKv($("s-errors"), s.errors);
  showCluster(s.cluster ?? null, s.now_us);
  draw();
}

/**
 * Rates between consecutive samples, at the later one's time; NaN where there is no rate
 * (samples more than 3 s apart, or a counter that went back: herald restarted).
 * @param {keyof Sample} key
 * @returns {[number, number][]}
 */
function rates(key) {
  /** @type {[number, number][]} */
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = (b.now_us - a.now_us) / 1e6;
    out.push([b.now_us, dt > 0 && dt <= 3 && b[key] >= a[key] ? (b[key] - a[key]) / dt : NaN]);
  }
  return out;
}

function draw() {
  if (!visible) return;
  // herald's clock while it answers; the page's (the same one on herald's host) while it does not.
  const now = (!unreachableSince && samples[samples.length - 1]?.now_us) || Date.now() * 1000;
  lineChart(/** @type {HTMLCanvasElement} */ ($("rate-chart")), [
    { points: rates("messages_in"), color: "--in" },
    { points: rates("deliveries"), color: "--out" },
  ], { nowUs: now, windowUs: WINDOW_US, format: count });
  $("rate-chart").dataset.points = String(Math.max(0, samples.length - 1));
}
