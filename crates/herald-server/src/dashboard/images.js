// Image view: the newest image of a topic on a canvas. JPEG and PNG are decoded by the browser
// (createImageBitmap); FITS by fits.js. The handler only keeps the newest frame; drawing happens
// on animation frames, one image at a time, so a stream faster than the display skips frames
// (counted) instead of queueing them. The subscription exists only while the view is shown.

import { isFits, parseFits, limits, colourMap, paint } from "./fits.js";
import { count, bytes } from "./format.js";
import { topicMatches } from "./herald-client.js";
import { release } from "./api.js";

const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
/** Writes text only when it changed: at tens of frames per second, every DOM write costs a
 * style and layout pass on the thread that also decodes and receives.
 * @param {string} id @param {string} text */
const setText = (id, text) => {
  const el = $(id);
  if (el.textContent !== text) el.textContent = text;
};
const canvas = /** @type {HTMLCanvasElement} */ (document.getElementById("i-canvas"));
const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));

/** @type {import("./herald-client.js").HeraldClient} */
let client;
/** @type {import("./herald-client.js").Subscription | null} */
let sub = null;
/** The newest frame not drawn yet. @type {import("./herald-client.js").Message | null} */
let pending = null;
/** The last frame drawn, redrawn when the scale or colours change. @type {import("./herald-client.js").Message | null} */
let shown = null;
let busy = false;
let received = 0, drawn = 0, skipped = 0, dropped = 0;
/** Times of the frames drawn in the last second. @type {number[]} */
const drawTimes = [];
/** @type {ImageData | null} */
let imageData = null;
/** How long the last draw took (decode, scale, paint). */
let drawMs = NaN;
let visible = false;

/** @param {import("./herald-client.js").HeraldClient} c */
export function init(c) {
  client = c;
  $("i-form").addEventListener("submit", (e) => {
    e.preventDefault();
    subscribe();
  });
  for (const id of ["i-scale", "i-cmap"]) {
    $(id).addEventListener("change", () => {
      if (!pending) pending = shown;
    });
  }
  client.on("dropped", (d) => {
    if (sub && topicMatches(sub.pattern, d.topic)) dropped += d.count;
  });
  requestAnimationFrame(frame);
  setInterval(stats, 250);
}

export function show() {
  visible = true;
  if (!sub) subscribe();
}

export function hide() {
  visible = false;
  release(sub);
  sub = null;
  pending = null;
}

/** Shows the images of `pattern` from when the view is shown. @param {string} pattern */
export function watch(pattern) {
  /** @type {HTMLInputElement} */ ($("i-topic")).value = pattern;
  if (visible) subscribe();
}

function subscribe() {
  const pattern = /** @type {HTMLInputElement} */ ($("i-topic")).value.trim();
  release(sub);
  received = drawn = skipped = dropped = 0;
  canvas.dataset.received = canvas.dataset.drawn = "0";
  // An image stream should skip to the newest image rather than fall behind: conflate where
  // herald supports it (herald ignores the field where it does not).
  sub = client.subscribe(pattern, onImage, { snapshot: true, policy: "conflate" });
  sub.ready.catch((e) => (setText("i-type", `cannot watch: ${e.message}`)));
}

/** @param {import("./herald-client.js").Message} m */
function onImage(m) {
  if (typeof m.data === "string") return; // not an image
  received++;
  canvas.dataset.received = String(received); // exact and current, for scripts (the table lags)
  if (pending) skipped++;
  pending = m;
}

function frame() {
  requestAnimationFrame(frame);
  if (busy || !pending) return;
  const m = pending;
  pending = null;
  busy = true;
  const t0 = performance.now();
  draw(m).then(
    () => {
      const now = performance.now();
      drawMs = now - t0;
      if (m === shown) return; // redrawn for a new scale or colour map: not a new frame
      shown = m;
      drawn++;
      canvas.dataset.drawn = String(drawn);
      drawTimes.push(now);
    },
    (e) => {
      setText("i-type", `cannot display: ${e.message}`);
    },
  ).finally(() => (busy = false));
}

/** @param {import("./herald-client.js").Message} m */
async function draw(m) {
  const data = /** @type {Uint8Array} */ (m.data);
  setText("i-topic-shown", m.topic);
  if (isFits(data) || /fits/i.test(m.ct ?? "")) {
    const f = parseFits(data);
    const mode = /** @type {"linear" | "zscale"} */ (/** @type {HTMLSelectElement} */ ($("i-scale")).value);
    const range = limits(f, data, mode);
    resize(f.width, f.height);
    if (!imageData || imageData.width !== f.width || imageData.height !== f.height) imageData = ctx.createImageData(f.width, f.height);
    const cmap = colourMap(/** @type {any} */ (/** @type {HTMLSelectElement} */ ($("i-cmap")).value));
    paint(f, data, range, cmap, new Uint32Array(imageData.data.buffer));
    ctx.putImageData(imageData, 0, 0);
    setText("i-size", `${f.width} × ${f.height}, ${bytes(data.byteLength)}`);
    setText("i-type", `FITS, BITPIX ${f.bitpix}`);
    setText("i-range", `${fmt(range[0])} … ${fmt(range[1])}`);
    setText("i-header", f.cards.join("\n"));
    return;
  }
  const bitmap = await createImageBitmap(new Blob([data], { type: m.ct ?? "" }));
  resize(bitmap.width, bitmap.height);
  ctx.drawImage(bitmap, 0, 0);
  bitmap.close();
  setText("i-size", `${canvas.width} × ${canvas.height}, ${bytes(data.byteLength)}`);
  setText("i-type", m.ct ?? "image");
  setText("i-range", "–");
  setText("i-header", "(not a FITS image: no header)");
}

/** @param {number} v */
function fmt(v) {
  return Math.abs(v) >= 1e5 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : String(Math.round(v * 100) / 100);
}

/** @param {number} w @param {number} h */
function resize(w, h) {
  if (canvas.width !== w || canvas.height !== h) {
    canvas.width = w;
    canvas.height = h;
  }
}

function stats() {
  const now = performance.now();
  while (drawTimes.length && drawTimes[0] < now - 1000) drawTimes.shift();
  $("i-fps").textContent = String(drawTimes.length);
  if (!Number.isNaN(drawMs)) $("i-ms").textContent = `${drawMs.toFixed(1)} ms`;
  $("i-received").textContent = count(received);
  $("i-drawn").textContent = count(drawn);
  $("i-skipped").textContent = count(skipped);
  $("i-dropped").textContent = count(dropped);
}
