// The TypeScript declarations in types/ (generated from the source's JSDoc by `npm run types`):
// they show the public API only, and type `publish` by its `ack` option.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";

const here = (/** @type {string} */ p) => fileURLToPath(new URL(p, import.meta.url));

test("the declarations show no internals", () => {
  const dts = readFileSync(here("../types/herald-client.d.ts"), "utf8");
  const members = [...dts.matchAll(/^ {4}(?:readonly )?([A-Za-z_$#][\w$]*)\??[(:<]/gm)].map((m) => m[1]);
  for (const internal of ["receive", "deliver", "pending", "credits", "send", "request", "sendSubscribe", "settle", "run", "credit", "emit", "setState", "positions", "resolveReady", "options", "ws"]) {
    assert.ok(!members.includes(internal), `${internal} is declared: ${members.join(", ")}`);
  }
  assert.doesNotMatch(dts, /resolves with the sequence number/);
});

test("the declarations type-check real use, and refuse internals and a missing Ack", async () => {
  const tsc = here("../node_modules/typescript/bin/tsc");
  const args = [tsc, "--noEmit", "--strict", "--target", "ES2022", "--module", "ES2022", "--moduleResolution", "bundler", "--lib", "ES2022,DOM", here("types-usage.ts")];
  const run = await promisify(execFile)(process.execPath, args).then(
    () => "",
    (e) => `${e.stdout}${e.stderr}`,
  );
  assert.equal(run, "");
});
