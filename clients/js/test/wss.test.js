// `wss://` from a real browser: herald serves TLS with a certificate issued by a private CA made
// here with the openssl CLI, and Debian's Chromium (playwright-core) connects, subscribes and
// receives a message. Chromium is told to trust exactly that server key
// (--ignore-certificate-errors-spki-list, which pins one SPKI hash; every other certificate error
// still fails), and a second Chromium without the pin must fail to connect: the test proves the
// certificate is really checked, not that errors are ignored.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { createHash, X509Certificate } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { chromium } from "playwright-core";
import { HERALD_BIN, freePort } from "./herald.js";
import { CHROMIUM, CHROMIUM_ARGS } from "./browser.js";

const skip = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`;

/** A private CA and a server certificate it signed for 127.0.0.1 and localhost. */
function makeCertificates(dir) {
  const openssl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  openssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=herald test CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign");
  openssl("req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost");
  writeFileSync(join(dir, "server.ext"),
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n");
  openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-days", "1", "-extfile", "server.ext", "-out", "server.pem");
  const server = new X509Certificate(readFileSync(join(dir, "server.pem")));
  // Base64 of SHA-256 over the DER SubjectPublicKeyInfo: the form Chromium's pin list takes.
  const spki = createHash("sha256").update(server.publicKey.export({ type: "spki", format: "der" })).digest("base64");
  return { ca: readFileSync(join(dir, "ca.pem")), cert: join(dir, "server.pem"), key: join(dir, "server.key"), spki };
}

/** GET or POST (text) over https trusting only `ca`; resolves with [status, body]. */
function https(ca, method, url, body = "") {
  return new Promise((resolve, reject) => {
    const headers = { "content-type": "text/plain" };
    const req = request(url, { method, ca, headers, timeout: 5_000 }, (res) => {
      let text = "";
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve([res.statusCode, text]));
    });
    req.on("error", reject);
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.end(body);
  });
}

let dir;
let certs;
let port;
/** @type {import("node:child_process").ChildProcess} */
let herald;
let log = "";

before(async () => {
  if (skip) return;
  if (!HERALD_BIN) throw new Error("HERALD_BIN is not set: point it at a built herald (scripts/test does)");
  dir = mkdtempSync(join(tmpdir(), "herald-wss-"));
  certs = makeCertificates(dir);
  port = await freePort();
  herald = spawn(HERALD_BIN, ["serve", "--listen", `127.0.0.1:${port}`, "--tls-cert-file", certs.cert, "--tls-key-file", certs.key],
    { stdio: ["ignore", "pipe", "pipe"] });
  herald.stdout.on("data", (d) => (log += d));
  herald.stderr.on("data", (d) => (log += d));
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (herald.exitCode !== null) throw new Error(`herald exited early (${herald.exitCode}):\n${log}`);
    // Node verifies the chain against the CA and the IP in the certificate: the certificates
    // are valid as issued, so the browser's verdict below is about trust, not a malformed cert.
    const ok = await https(certs.ca, "GET", `https://127.0.0.1:${port}/healthz`).then(([s]) => s === 200, () => false);
    if (ok) break;
    if (Date.now() > deadline) throw new Error(`herald did not answer https /healthz within 10 s:\n${log}`);
    await sleep(50);
  }
});

after(async () => {
  if (herald && herald.exitCode === null) {
    const exited = new Promise((resolve) => herald.once("exit", resolve));
    herald.kill("SIGTERM");
    await exited;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/**
 * In a fresh Chromium launched with `extraArgs`: opens wss://127.0.0.1:port/ws, subscribes to
 * `topic`, and reports the first message on it (published from Node once the browser says it is
 * subscribed), or how the connection failed.
 */
async function browserSubscribe(extraArgs, topic) {
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: [...CHROMIUM_ARGS, ...extraArgs] });
  try {
    const page = await browser.newPage();
    const outcome = page.evaluate(({ url, topic }) => new Promise((resolve) => {
      const ws = new WebSocket(url);
      const w = /** @type {any} */ (window);
      const timer = setTimeout(() => resolve({ error: "timeout" }), 8_000);
      ws.onopen = () => ws.send(JSON.stringify({ op: "sub", id: 1, topic }));
      ws.onmessage = (e) => {
        const m = JSON.parse(e.data);
        if (m.op === "subscribed") w.subscribed = true;
        if (m.op === "msg") {
          clearTimeout(timer);
          resolve({ data: m.data, topic: m.topic });
          ws.close();
        }
      };
      ws.onclose = (e) => {
        clearTimeout(timer);
        resolve({ error: `closed ${e.code}`, opened: w.subscribed === true });
      };
    }), { url: `wss://127.0.0.1:${port}/ws`, topic });
    // Publish once the browser is subscribed; give up early if the connection already failed.
    const ready = page.waitForFunction(() => /** @type {any} */ (window).subscribed === true, null, { timeout: 8_000 });
    const first = await Promise.race([ready.then(() => "subscribed", () => "not subscribed"), outcome.then(() => "ended")]);
    if (first === "subscribed") {
      const [status, body] = await https(certs.ca, "POST", `https://127.0.0.1:${port}/api/publish/${topic}`, "over wss");
      assert.equal(status, 200, body);
    }
    return await outcome;
  } finally {
    await browser.close();
  }
}

test("Chromium trusting the server key connects over wss://, subscribes and receives", { skip }, async () => {
  const got = await browserSubscribe([`--ignore-certificate-errors-spki-list=${certs.spki}`], "secure/demo");
  assert.deepEqual(got, { data: "over wss", topic: "secure/demo" }, log);
});

test("Chromium without the pin refuses the private CA's certificate", { skip }, async () => {
  const got = await browserSubscribe([], "secure/demo");
  assert.equal(got.opened, false, "the WebSocket must never have been subscribed");
  assert.match(got.error, /^closed 1006$/, JSON.stringify(got));
});

test("a pin for another key does not make Chromium trust this one", { skip }, async () => {
  const other = createHash("sha256").update("not the server key").digest("base64");
  const got = await browserSubscribe([`--ignore-certificate-errors-spki-list=${other}`], "secure/demo");
  assert.equal(got.opened, false, JSON.stringify(got));
});
