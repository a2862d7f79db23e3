// Runs a real herald process for the tests: `HERALD_BIN` (scripts/test sets it to the release
// build) on a free loopback port, which `restart()` reuses so clients can reconnect to it.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

export const HERALD_BIN = process.env.HERALD_BIN;

/** A free TCP port on 127.0.0.1 (bind port 0, read it, release it). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = /** @type {import("node:net").AddressInfo} */ (srv.address());
      srv.close(() => resolve(port));
    });
  });
}

export class Herald {
  /** @param {string[]} args  extra `herald serve` arguments */
  constructor(args = []) {
    this.args = args;
    this.port = 0;
    this.proc = null;
    this.log = "";
  }

  static async start(args = []) {
    const h = new Herald(args);
    h.port = await freePort();
    await h.spawn();
    return h;
  }

  get http() {
    return `http://127.0.0.1:${this.port}`;
  }

  get running() {
    return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  get ws() {
    return `ws://127.0.0.1:${this.port}/ws`;
  }

  async spawn() {
    if (!HERALD_BIN) throw new Error("HERALD_BIN is not set: point it at a built herald (scripts/test does)");
    const proc = spawn(HERALD_BIN, ["serve", "--listen", `127.0.0.1:${this.port}`, ...this.args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.proc = proc;
    proc.stdout.on("data", (d) => (this.log += d));
    proc.stderr.on("data", (d) => (this.log += d));
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw new Error(`herald exited early (${proc.exitCode}):\n${this.log}`);
      try {
        if ((await fetch(`${this.http}/healthz`)).ok) return;
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
    await this.stop();
    throw new Error(`herald did not answer /healthz within 10 s:\n${this.log}`);
  }

  /** Stops the process (SIGTERM, then SIGKILL after 5 s) and waits for it to exit. */
  async stop(signal = "SIGTERM") {
    const proc = this.proc;
    if (!proc || !this.running) return;
    const exited = new Promise((resolve) => proc.once("exit", resolve));
    proc.kill(signal);
    const timer = setTimeout(() => proc.kill("SIGKILL"), 5_000);
    await exited;
    clearTimeout(timer);
  }

  /** Kills the process (its in-memory history goes with it) and starts a new one on the same port. */
  async restart(signal = "SIGKILL") {
    await this.stop(signal);
    await this.spawn();
  }

  /** `POST /api/publish/{topic}`; returns the JSON reply. */
  async publishHttp(topic, body, contentType = "text/plain") {
    const r = await fetch(`${this.http}/api/publish/${topic}`, {
      method: "POST",
      headers: { "content-type": contentType },
      body,
    });
    return { status: r.status, body: await r.json() };
  }
}

/** Polls `check` until it returns a truthy value or `ms` pass (then fails with `what`). */
export async function until(check, what, ms = 5_000) {
  const describe = () => (typeof what === "function" ? what() : what);
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${describe()}`);
    await sleep(20);
  }
}

/** A temporary directory, removed after the test. */
export function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), "herald-test-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A herald of its own for one test, started with `config` (TOML) and `args`; stopped after it. */
export async function heraldWith(t, config, args = [], dir = tempDir(t)) {
  const file = join(dir, "herald.toml");
  writeFileSync(file, config);
  const h = await Herald.start(["--config", file, ...args]);
  t.after(() => h.stop());
  return h;
}
