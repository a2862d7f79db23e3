// The dashboard in a real browser: Debian's Chromium driven by playwright-core, against a real
// herald. HERALD_SCREENSHOTS=<dir> saves a screenshot of every view there (docs/img).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { promisify } from "node:util";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { chromium } from "playwright-core";
import { Herald, HERALD_BIN, freePort, until, tempDir, heraldWith } from "./herald.js";
import { writeFits } from "./fits-writer.js";
import { connect } from "../src/herald-client.js";
import { CHROMIUM, CHROMIUM_ARGS } from "./browser.js";

const shots = process.env.HERALD_SCREENSHOTS;
const skip = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`;

/** @type {Herald} */
let herald;
/** @type {import("playwright-core").Browser} */
let browser;
/** @type {import("playwright-core").Page} */
let page;
/** Console errors and uncaught exceptions: the dashboard must have none. @type {string[]} */
const problems = [];

before(async () => {
  if (skip) return;
  herald = await Herald.start();
  browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("console", (m) => m.type() === "error" && problems.push(`console: ${m.text()}`));
  page.on("pageerror", (e) => problems.push(`exception: ${e.message}`));
  await page.goto(herald.http + "/");
});

after(async () => {
  await browser?.close();
  await herald?.stop();
});

/** @param {string} name @param {import("playwright-core").Page} [p] */
async function screenshot(name, p = page) {
  if (shots) await p.screenshot({ path: join(shots, `dashboard-${name}.png`) });
}

/** @param {string} id */
const text = (id) => page.locator(`#${id}`).innerText();

test("the overview loads and shows live numbers", { skip }, async () => {
  await page.waitForFunction(() => document.getElementById("conn")?.textContent === "open");
  // The page itself holds a connection; /api/stats reports it.
  await page.waitForFunction(() => Number(document.getElementById("s-connections")?.textContent) >= 1);
  for (let i = 0; i < 20; i++) await herald.publishHttp(`demo/sensors/t${i % 4}`, String(20 + i));
  await page.waitForFunction(() => document.getElementById("s-in-rate")?.textContent !== "–");
  await page.waitForTimeout(2500); // a few chart points
  assert.equal(await text("s-topics"), "4");
  assert.equal(await page.locator("#cluster-panel").isHidden(), true, "a node alone has no cluster panel");
  await screenshot("overview");
});

test("herald keeps the overview's last five minutes: a page opened later draws them at once", { skip }, async () => {
  // herald samples once a second from its start; wait until it holds several samples.
  const history = await until(async () => {
    const h = await (await fetch(`${herald.http}/api/stats/history`)).json();
    return h.samples.length >= 6 && h;
  }, "six samples in /api/stats/history", 10_000);
  assert.equal(history.interval_secs, 1);
  const times = history.samples.map((x) => x.now_us);
  assert.deepEqual(times, [...times].sort((a, b) => a - b), "oldest first");
  for (const key of ["now_us", "connections", "subscriptions", "topics", "messages_in", "bytes_in", "deliveries", "bytes_out"]) {
    assert.equal(typeof history.samples[0][key], "number", key);
  }
  const later = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  try {
    const started = Date.now();
    await later.goto(herald.http + "/#overview");
    // On its own the page would need a second per point; from herald's history it has them all.
    await later.waitForFunction(() => Number(document.getElementById("rate-chart")?.dataset.points) >= 5, undefined, { timeout: 1500 });
    assert.ok(Date.now() - started < 2500);
  } finally {
    await later.close();
  }
});

const NATS_SERVER = ["/usr/sbin/nats-server", "/usr/bin/nats-server"].find((p) => existsSync(p));

test("a node in a cluster shows its NATS state", { skip: skip || (!NATS_SERVER && "no nats-server (apt-get install nats-server)") }, async () => {
  const natsPort = await freePort();
  const nats = spawn(/** @type {string} */ (NATS_SERVER), ["-a", "127.0.0.1", "-p", String(natsPort)], { stdio: "ignore" });
  const node = await Herald.start(["--nats", `nats://127.0.0.1:${natsPort}`]);
  const clustered = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  clustered.on("console", (m) => m.type() === "error" && problems.push(`cluster page console: ${m.text()}`));
  clustered.on("pageerror", (e) => problems.push(`cluster page exception: ${e.message}`));
  try {
    await clustered.goto(`${node.http}/#overview`);
    await clustered.waitForFunction(() => !document.getElementById("cluster-panel")?.hidden);
    await clustered.waitForFunction(() => document.getElementById("s-cluster")?.textContent?.includes("connected"));
    const rows = await clustered.locator("#s-cluster tr").allInnerTexts();
    assert.match(rows[0], /NATS\s+connected/);
    assert.match(rows[1], /nodes seen\s+1/);
    // The page's own subscriptions are interest this node holds on NATS.
    assert.ok(rows.some((r) => /messages out via NATS/.test(r)), rows.join("\n"));
    if (shots) await clustered.screenshot({ path: join(shots, "dashboard-cluster.png") });
  } finally {
    await clustered.close();
    await node.stop();
    nats.kill();
  }
});

test("the topic explorer shows the tree with subscribers and last values", { skip }, async () => {
  await page.goto(herald.http + "/#topics");
  const row = page.locator("#t-body tr", { hasText: "t3" });
  await row.waitFor();
  const cells = await row.locator("td").allInnerTexts();
  assert.match(cells[0], /t3/);
  assert.equal(cells[4], "39", "the last value of demo/sensors/t3");
  const branch = await page.locator("#t-body tr.branch", { hasText: "sensors/" }).locator("td").allInnerTexts();
  assert.match(branch[0], /sensors\/ 4 topics/, "a branch says how many topics it holds");
  assert.equal(branch[3], "", "and has no sequence number");
  await screenshot("topics");
});

test("a message published with `herald pub` appears in the live view", { skip }, async () => {
  await page.goto(herald.http + "/#live");
  await page.waitForFunction(() => document.getElementById("conn")?.textContent === "open");
  await page.waitForTimeout(200); // the view's subscription reply
  await promisify(execFile)(HERALD_BIN ?? "herald", ["pub", "--url", herald.ws, "demo/cli", "hello from herald pub"]);
  const row = page.locator("#l-body tr", { hasText: "hello from herald pub" });
  await row.waitFor({ timeout: 5000 });
  assert.match(await row.innerText(), /demo\/cli/);
  await screenshot("live");
});

test("the live view stays responsive at 10,000 msg/s and counts what it does not show", { skip }, async () => {
  const c = connect(herald.ws);
  try {
    await c.whenOpen();
    const start = Date.now();
    let sent = 0;
    // About 10,000 msg/s for two seconds.
    const publishing = (async () => {
      while (Date.now() - start < 2000) {
        for (let i = 0; i < 100; i++) c.publish("demo/flood", String(sent++), { ack: false });
        await new Promise((r) => setTimeout(r, 10));
      }
      await c.ping();
    })();
    // The page's own event-loop lag: a 50 ms timer that fires late means the page was busy.
    await page.evaluate(() => {
      const w = /** @type {any} */ (window);
      w.lag = 0;
      let last = performance.now();
      w.lagTimer = setInterval(() => {
        const now = performance.now();
        w.lag = Math.max(w.lag, now - last - 50);
        last = now;
      }, 50);
    });
    await publishing;
    const slowest = await page.evaluate(() => {
      const w = /** @type {any} */ (window);
      clearInterval(w.lagTimer);
      return Math.round(w.lag);
    });
    // Every message arrives or is announced as dropped (Live's policy is `drop`).
    await page.waitForFunction((n) => {
      const v = (id) => Number(document.getElementById(id)?.textContent?.replace(/,/g, "").replace(/k$/, "e3"));
      return v("l-received") + v("l-dropped") >= n;
    }, sent, { timeout: 10_000 });
    const rows = await page.locator("#l-body tr").count();
    assert.ok(rows <= 100, `at most 100 rows rendered (got ${rows})`);
    assert.ok(slowest < 1000, `the page's event loop never stalled for 1 s (worst lag ${slowest} ms)`);
    const skipped = Number((await text("l-skipped")).replace(/,/g, "").replace(/k$/, "e3"));
    assert.ok(skipped > sent / 2, `most messages were counted, not rendered (${skipped} of ${sent})`);
  } finally {
    c.close();
  }
});

test("a FITS image published over HTTP is drawn on the canvas", { skip }, async () => {
  await page.goto(herald.http + "/#images");
  await page.selectOption("#i-scale", "linear");
  await page.waitForTimeout(300);
  // 64 × 48, 16-bit: a left-to-right ramp, and one bright corner in the first stored row
  // (FITS stores the bottom row first, so it must be drawn at the bottom left).
  const fits = writeFits(64, 48, 16, (x, y) => (x === 0 && y === 0 ? 30000 : x * 100 - 3000), { BZERO: 0, OBJECT: "ramp" });
  const r = await herald.publishHttp("camera/1/raw", fits, "image/fits");
  assert.equal(r.status, 200);
  await page.waitForFunction(() => Number(document.getElementById("i-canvas")?.dataset.drawn) >= 1);
  assert.equal(await page.locator("#i-canvas").getAttribute("data-drawn"), "1", "one image, drawn once");
  const px = await page.evaluate(() => {
    const c = /** @type {HTMLCanvasElement} */ (document.getElementById("i-canvas"));
    const d = /** @type {CanvasRenderingContext2D} */ (c.getContext("2d")).getImageData(0, 0, c.width, c.height);
    const at = (x, y) => Array.from(d.data.slice((y * c.width + x) * 4, (y * c.width + x) * 4 + 4));
    return { w: c.width, h: c.height, bottomLeft: at(0, 47), topLeft: at(0, 0), topRight: at(63, 0), middle: at(32, 10) };
  });
  assert.equal(px.w, 64);
  assert.equal(px.h, 48);
  assert.deepEqual(px.bottomLeft, [255, 255, 255, 255], "the hot pixel, drawn at the bottom (FITS rows flipped)");
  assert.deepEqual(px.topLeft, [0, 0, 0, 255], "the ramp's minimum is black in linear scale");
  // linear over -3000 … 30000: x = 63 is 3300 → (6300 / 33000) · 255 ≈ 48; x = 32 → 24.
  assert.ok(Math.abs(px.topRight[0] - 48) <= 1, `ramp end ${px.topRight}`);
  assert.ok(Math.abs(px.middle[0] - 24) <= 1, `ramp middle ${px.middle}`);
  assert.equal(px.topRight[0], px.topRight[1], "grey");
  assert.match(await page.locator("#i-header").textContent() ?? "", /OBJECT\s*=\s*'ramp'/);
  assert.equal(await text("i-type"), "FITS, BITPIX 16");
  // Another scale redraws the frame on screen; it is not counted as a new frame.
  await page.selectOption("#i-scale", "zscale");
  await page.waitForTimeout(500);
  assert.equal(await page.locator("#i-canvas").getAttribute("data-drawn"), "1");
});

test("a 32-bit float FITS image is drawn with the colour map", { skip }, async () => {
  await page.selectOption("#i-cmap", "heat");
  await page.selectOption("#i-scale", "zscale");
  const w = 256;
  const fits = writeFits(w, w, -32, (x, y) => Math.sin(x / 20) * Math.cos(y / 25) * 1000 + (x === y ? 5000 : 0));
  const before = Number(await text("i-drawn"));
  await herald.publishHttp("camera/2/float", fits, "image/fits");
  await page.waitForFunction((n) => Number(document.getElementById("i-drawn")?.textContent) > n, before);
  assert.equal(await text("i-type"), "FITS, BITPIX -32");
  const distinct = await page.evaluate(() => {
    const c = /** @type {HTMLCanvasElement} */ (document.getElementById("i-canvas"));
    const d = /** @type {CanvasRenderingContext2D} */ (c.getContext("2d")).getImageData(0, 0, c.width, c.height).data;
    const colours = new Set();
    let notGrey = 0;
    for (let i = 0; i < d.length; i += 4 * 97) {
      colours.add(`${d[i]},${d[i + 1]},${d[i + 2]}`);
      if (d[i] !== d[i + 2]) notGrey++;
    }
    return { colours: colours.size, notGrey, w: c.width };
  });
  assert.equal(distinct.w, w);
  assert.ok(distinct.colours > 50, `a smooth image has many colours (${distinct.colours})`);
  assert.ok(distinct.notGrey > 100, "the heat map is not grey");
  await screenshot("images");
});

test("a JPEG image is drawn directly", { skip }, async () => {
  // The browser makes the JPEG: a red canvas encoded by Chromium itself.
  const jpeg = await page.evaluate(async () => {
    const c = new OffscreenCanvas(40, 30);
    const g = /** @type {OffscreenCanvasRenderingContext2D} */ (c.getContext("2d"));
    g.fillStyle = "#ff0000";
    g.fillRect(0, 0, 40, 30);
    const blob = await c.convertToBlob({ type: "image/jpeg", quality: 0.95 });
    return Array.from(new Uint8Array(await blob.arrayBuffer()));
  });
  const before = Number(await text("i-drawn"));
  await herald.publishHttp("camera/3/jpeg", new Uint8Array(jpeg), "image/jpeg");
  await page.waitForFunction((n) => Number(document.getElementById("i-drawn")?.textContent) > n, before);
  const px = await page.evaluate(() => {
    const c = /** @type {HTMLCanvasElement} */ (document.getElementById("i-canvas"));
    return { w: c.width, p: Array.from(/** @type {CanvasRenderingContext2D} */ (c.getContext("2d")).getImageData(20, 15, 1, 1).data) };
  });
  assert.equal(px.w, 40);
  assert.ok(px.p[0] > 240 && px.p[1] < 20 && px.p[2] < 20, `red: ${px.p}`);
  assert.equal(await page.locator("#i-header").textContent(), "(not a FITS image: no header)", "not the previous FITS header");
});

test("the topic explorer's watch opens images in Images and the rest in Live", { skip }, async () => {
  await page.goto(herald.http + "/#topics");
  await page.locator("#t-body tr", { hasText: "jpeg" }).locator("a.watch").click();
  await page.waitForFunction(() => location.hash === "#images");
  assert.equal(await page.inputValue("#i-topic"), "camera/3/jpeg");
  await page.waitForFunction(() => Number(document.getElementById("i-drawn")?.textContent) >= 1, undefined, { timeout: 5000 });
  await page.goto(herald.http + "/#topics");
  await page.locator("#t-body tr", { hasText: "t3" }).locator("a.watch").click();
  await page.waitForFunction(() => location.hash === "#live");
  assert.equal(await page.inputValue("#l-pattern"), "demo/sensors/t3");
  await page.evaluate(() => (location.hash = "#images"));
  await page.fill("#i-topic", "camera/>");
  await page.click("#i-form button[type=submit]");
});

test("Live refuses to publish invalid JSON as application/json", { skip }, async () => {
  await page.goto(herald.http + "/#live");
  await page.selectOption("#p-ct", "application/json");
  await page.fill("#p-topic", "demo/json");
  await page.fill("#p-data", "{not json");
  await page.click("#p-form button[type=submit]");
  await page.waitForFunction(() => /^not sent: not valid JSON/.test(document.getElementById("p-result")?.textContent ?? ""));
  await page.fill("#p-data", '{"ok": true}');
  await page.click("#p-form button[type=submit]");
  await page.waitForFunction(() => /^published demo\/json #1$/.test(document.getElementById("p-result")?.textContent ?? ""));
  await page.selectOption("#p-ct", "text/plain");
});

test("the latency view shows percentiles of both legs", { skip }, async () => {
  await page.goto(herald.http + "/#latency");
  await page.waitForFunction(() => {
    const cells = [...document.querySelectorAll("#lat-body td")].map((td) => td.textContent ?? "");
    return cells.length === 18 && Number(cells[1].replace(/,/g, "")) >= 20 && Number(cells[7].replace(/,/g, "")) >= 20;
  }, undefined, { timeout: 10_000 });
  const cells = await page.locator("#lat-body td").allInnerTexts();
  for (const i of [2, 3, 4, 8, 9, 10]) assert.match(cells[i], /^\d+(\.\d+)? (µs|ms)$/, `cell ${i}: ${cells[i]}`);
  await screenshot("latency");
  // herald never forgets a topic: visits, and other pages, share one probe topic.
  await page.goto(herald.http + "/#overview");
  await page.goto(herald.http + "/#latency");
  await page.waitForFunction(() => Number(document.querySelectorAll("#lat-body td")[1]?.textContent) >= 5);
  const probes = await (await fetch(`${herald.http}/api/topics?prefix=herald/probe/`)).json();
  assert.deepEqual(probes.topics.map((t) => t.topic), ["herald/probe/dashboard"]);
});

test("a narrow window has no horizontal scrolling", { skip }, async () => {
  await page.setViewportSize({ width: 400, height: 800 });
  for (const view of ["overview", "topics", "live", "images", "latency"]) {
    await page.goto(`${herald.http}/#${view}`);
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `#${view} overflows by ${overflow} px at 400 px`);
  }
  await page.goto(`${herald.http}/#overview`);
  await page.waitForTimeout(1500);
  await screenshot("narrow");
  await page.setViewportSize({ width: 1280, height: 800 });
});

/** A page of its own on `h`, closed after the test; its console errors are collected unless
 * `expected` matches them (Chromium logs every refused request and connection). */
async function pageOn(t, h, hash = "", expected = /^$/) {
  const p = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  t.after(() => p.close());
  p.on("console", (m) => m.type() === "error" && !expected.test(m.text()) && problems.push(`page on :${h.port}: ${m.text()}`));
  p.on("pageerror", (e) => problems.push(`page on :${h.port}: exception: ${e.message}`));
  // Every state the page's connection goes through, recorded in the page.
  await p.addInitScript(() => {
    const w = /** @type {any} */ (window);
    w.pillStates = [];
    new MutationObserver(() => {
      const pill = document.getElementById("conn");
      if (pill && w.pillStates.at(-1) !== pill.textContent) w.pillStates.push(pill.textContent);
    }).observe(document, { subtree: true, childList: true, characterData: true });
  });
  await p.goto(`${h.http}/${hash}`);
  return p;
}

/** Pauses the page's main thread for `ms`, as a slow decode or a busy tab does. */
const busy = (p, ms) => p.evaluate((ms) => {
  const end = performance.now() + ms;
  while (performance.now() < end);
}, ms);

test("a view's subscription never takes the page down: hidden views hold none, Live drops rather than disconnects", { skip }, async (t) => {
  const h = await heraldWith(t, "max_outbound_bytes = 1048576\n");
  const stats = async () => (await fetch(`${h.http}/api/stats`)).json();
  const p = await pageOn(t, h, "#live");
  await p.waitForFunction(() => document.getElementById("conn")?.textContent === "open");
  await until(async () => (await stats()).subscriptions === 1, "Live's subscription");
  await p.goto(`${h.http}/#images`);
  await until(async () => (await stats()).subscriptions === 1, "only the Images subscription");
  await p.evaluate(() => (location.hash = "#live"));
  await until(async () => (await stats()).subscriptions === 1, "Live's again, Images' gone");
  await p.evaluate(() => (location.hash = "#images"));
  await until(async () => (await stats()).subscriptions === 1, "Images' again, Live's gone");

  // Large FITS frames, faster than the page draws them, while the page is also busy: the
  // Images view skips frames; nothing disconnects the page.
  const frame = writeFits(1024, 1024, 16, (x, y) => (x * 7 + y * 13) & 0x7fff);
  const blocked = busy(p, 2000);
  for (let i = 0; i < 16; i++) await h.publishHttp("camera/flood", frame, "image/fits");
  await blocked;
  await p.waitForFunction(() => Number(document.getElementById("i-canvas")?.dataset.drawn) >= 1, undefined, { timeout: 10_000 });

  // Live on everything, the page stalled while 40 MiB arrive: herald drops (with notices, shown
  // on the page), and still nothing disconnects it.
  await p.evaluate(() => (location.hash = "#live"));
  await until(async () => (await stats()).subscriptions === 1, "Live's subscription");
  const chunk = "x".repeat(256 * 1024);
  const stalled = busy(p, 3000);
  for (let i = 0; i < 160; i++) await h.publishHttp("flood/text", chunk);
  await stalled;
  await p.waitForFunction(() => Number(document.getElementById("l-dropped")?.textContent?.replace(/,/g, "")) > 0, undefined, { timeout: 10_000 });
  // The notice bar counts herald's notices as they arrive, the view counts its own: either may
  // show first.
  await p.waitForFunction(() => /herald dropped for this page: .*[\d,.k]+ \(drop\)/.test(document.getElementById("notice-drops")?.textContent ?? ""), undefined, { timeout: 10_000 });
  assert.equal(await p.locator("#notice").isVisible(), true);
  const s = await stats();
  assert.deepEqual(s.disconnects, {}, "no slow-consumer disconnect");
  assert.deepEqual(await p.evaluate(() => /** @type {any} */ (window).pillStates), ["connecting", "open"], "the connection never dropped");
});

test("the reason of a disconnect is on screen, and the overview shows no stale numbers while herald is away", { skip }, async (t) => {
  const h = await heraldWith(t, "");
  const p = await pageOn(t, h, "#overview", /ERR_CONNECTION_REFUSED/);
  await p.waitForFunction(() => document.getElementById("s-connections")?.textContent === "1");
  await h.stop(); // SIGTERM: herald closes the page's connection with 1001
  await p.waitForFunction(() => /herald disconnected, reconnecting: \d{4}/.test(document.getElementById("notice-conn")?.textContent ?? ""));
  await p.waitForFunction(() => document.getElementById("s-connections")?.textContent === "–");
  assert.match(await p.locator("#rate-status").innerText(), /herald not reachable since/);
  await h.spawn();
  await p.waitForFunction(() => document.getElementById("s-connections")?.textContent === "1", undefined, { timeout: 15_000 });
  await p.waitForFunction(() => document.getElementById("conn")?.textContent === "open");
  assert.equal(await p.locator("#notice-conn").innerText(), "", "the notice goes once the connection is back");
  assert.equal(await p.locator("#rate-status").innerText(), "");
});

test("with authentication on: a login form, clear refusals, credentials from the URL fragment kept for the tab", { skip }, async (t) => {
  const dir = tempDir(t);
  const secret = join(dir, "secret");
  writeFileSync(secret, randomBytes(32).toString("base64"));
  const adminKey = randomBytes(16).toString("hex");
  writeFileSync(join(dir, "admin-key"), adminKey);
  const h = await heraldWith(t, `[auth]\nadmin_api_key_file = "${join(dir, "admin-key")}"\n`, ["--auth-hs256-secret-file", secret], dir);
  const { stdout } = await promisify(execFile)(/** @type {string} */ (HERALD_BIN), ["token", "--secret-file", secret, "--sub", ">", "--pub", "dash/>", "--ttl", "3600"]);
  const token = stdout.trim();

  // Nothing given: the form, saying what herald needs, and no green pill.
  const refusals = /status of 40[13]/;
  const p = await pageOn(t, h, "#overview", refusals);
  await p.locator("#login").waitFor();
  assert.match(await p.locator("#login-error").innerText(), /authentication on: \/api\/stats(\/history)? needs the admin API key \(HTTP 401\)/);
  assert.equal(await p.locator("#conn").innerText(), "sign in needed");
  assert.equal(await p.locator("#s-connections").innerText(), "–");
  await screenshot("login", p);

  // Wrong credentials: each refusal says which credential herald refused.
  await p.fill("#login-token", token.slice(0, -4) + "AAAA");
  await p.fill("#login-key", "not-the-key");
  await p.click("#login-form button[type=submit]");
  await p.locator("#login").waitFor();
  await p.waitForFunction(() => /herald refused the admin API key/.test(document.getElementById("login-error")?.textContent ?? ""));
  await p.waitForFunction(() => /herald refused the token/.test(document.getElementById("login-error")?.textContent ?? ""), undefined, { timeout: 5000 });

  // The right ones: everything works, and they survive a reload (session storage).
  await p.fill("#login-token", token);
  await p.fill("#login-key", adminKey);
  await p.click("#login-form button[type=submit]");
  await p.waitForFunction(() => document.getElementById("conn")?.textContent === "open");
  await p.waitForFunction(() => Number(document.getElementById("s-connections")?.textContent) >= 1);
  assert.equal(await p.locator("#login").isHidden(), true);
  await p.reload();
  await p.waitForFunction(() => Number(document.getElementById("s-connections")?.textContent) >= 1);
  await p.evaluate(() => (location.hash = "#live"));
  await p.waitForTimeout(300);
  await p.fill("#p-topic", "dash/hello");
  await p.click("#p-form button[type=submit]");
  await p.locator("#l-body tr", { hasText: "dash/hello" }).waitFor();
  assert.equal(await p.locator("#signout").isVisible(), true);
  await p.click("#signout");
  await p.locator("#login").waitFor();

  // A bookmark: the fragment signs in, opens its view, and leaves the address bar.
  const q = await pageOn(t, h, `#topics&token=${encodeURIComponent(token)}&admin_key=${encodeURIComponent(adminKey)}`);
  await q.waitForFunction(() => document.getElementById("conn")?.textContent === "open");
  await q.locator("#t-body tr", { hasText: "hello" }).waitFor();
  assert.equal(new URL(q.url()).hash, "#topics", "the credentials are gone from the URL");
  assert.equal(await q.evaluate(() => sessionStorage.getItem("herald.admin_key")), adminKey);
});

test("no console errors or uncaught exceptions", { skip }, () => {
  assert.deepEqual(problems, []);
});
