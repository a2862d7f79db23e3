// How many images per second the dashboard's image view actually draws, for 16-bit FITS and
// JPEG at 512², 1024² and 2048² (VBDS's browser figures: bench/RESULTS.md).
//
// A real herald, headless Chromium on the dashboard (#images), and a publisher (herald-client
// in Node) that keeps at most 3 images in flight to the page: the display is never starved, and
// herald never builds a backlog. The rate is frames drawn (canvas updated) per second over
// MEASURE_S seconds after a warm-up.
//
// Usage: HERALD_BIN=target/release/herald node --experimental-websocket bench/display-rate.js

import { chromium } from "playwright-core";
import { Herald } from "../test/herald.js";
import { writeFits } from "../test/fits-writer.js";
import { CHROMIUM, CHROMIUM_ARGS } from "../test/browser.js";
import { connect } from "../src/herald-client.js";

const SIZES = (process.env.SIZES ?? "512,1024,2048").split(",").map(Number);
const WARMUP_S = 2;
const MEASURE_S = Number(process.env.MEASURE_S ?? 10);
const IN_FLIGHT = Number(process.env.IN_FLIGHT ?? 3);

const herald = await Herald.start(["--max-outbound-bytes", String(256 << 20)]);
const browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
page.on("pageerror", (e) => console.error("page error:", e.message));
await page.goto(herald.http + "/#images");
const pub = connect(herald.ws);
await pub.whenOpen();

/** The image view's exact counters (`received`, `drawn`), kept on the canvas. @param {string} what */
const number = async (what) => Number(await page.locator("#i-canvas").getAttribute(`data-${what}`));

/** A sky-like test image: smooth background, noise, a few stars. */
const sky = (/** @type {number} */ n) => (/** @type {number} */ x, /** @type {number} */ y) => {
  const r2 = ((x - n / 2) ** 2 + (y - n / 3) ** 2) / (n / 40) ** 2;
  return Math.round(1000 + 200 * Math.sin(x / 37) * Math.cos(y / 53) + 300 * Math.random() + 20000 * Math.exp(-r2));
};

/** @param {number} n */
async function jpeg(n) {
  const bytes = await page.evaluate(async (n) => {
    const c = new OffscreenCanvas(n, n);
    const g = /** @type {OffscreenCanvasRenderingContext2D} */ (c.getContext("2d"));
    const img = g.createImageData(n, n);
    for (let i = 0; i < n * n; i++) {
      const x = i % n, y = (i / n) | 0;
      const v = 60 + 40 * Math.sin(x / 37) * Math.cos(y / 53) + 30 * Math.random() + 160 * Math.exp(-((x - n / 2) ** 2 + (y - n / 3) ** 2) / (n / 40) ** 2);
      img.data.set([v, v, v, 255], i * 4);
    }
    g.putImageData(img, 0, 0);
    const blob = await c.convertToBlob({ type: "image/jpeg", quality: 0.9 });
    return Array.from(new Uint8Array(await blob.arrayBuffer()));
  }, n);
  return new Uint8Array(bytes);
}

/** @param {string} kind @param {number} n @param {Uint8Array} payload @param {string} ct */
async function measure(kind, n, payload, ct) {
  const topic = `bench/${kind}/${n}`;
  await page.fill("#i-topic", topic);
  await page.click("#i-form button[type=submit]");
  await page.waitForTimeout(300);
  let published = 0;
  let stop = false;
  const publishing = (async () => {
    while (!stop) {
      if (published - (await number("received")) < IN_FLIGHT) {
        await pub.publish(topic, payload, { ct });
        published++;
      } else {
        await new Promise((r) => setTimeout(r, 2));
      }
    }
  })();
  await page.waitForTimeout(WARMUP_S * 1000);
  const [d0, r0, t0] = [await number("drawn"), await number("received"), Date.now()];
  await page.waitForTimeout(MEASURE_S * 1000);
  const [d1, r1, t1] = [await number("drawn"), await number("received"), Date.now()];
  stop = true;
  await publishing;
  const secs = (t1 - t0) / 1000;
  const drawMs = await page.locator("#i-ms").innerText();
  return { kind, size: `${n}²`, bytes: payload.length, drawn_per_s: +((d1 - d0) / secs).toFixed(1), received_per_s: +((r1 - r0) / secs).toFixed(1), last_draw: drawMs };
}

const results = [];
try {
  for (const n of SIZES) {
    results.push(await measure("fits", n, writeFits(n, n, 16, sky(n)), "image/fits"));
    console.error(JSON.stringify(results.at(-1)));
    results.push(await measure("jpeg", n, await jpeg(n), "image/jpeg"));
    console.error(JSON.stringify(results.at(-1)));
  }
} finally {
  pub.close();
  await browser.close();
  await herald.stop();
}
console.log("| image | payload | drawn / s | received / s | last draw |");
console.log("|---|---:|---:|---:|---:|");
for (const r of results) {
  console.log(`| ${r.size} ${r.kind === "fits" ? "× 2 B FITS" : "JPEG"} | ${(r.bytes / 1024).toFixed(0)} KiB | ${r.drawn_per_s} | ${r.received_per_s} | ${r.last_draw} |`);
}
