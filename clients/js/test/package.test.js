// What npm publishes besides the code: the licence text, and what finds and describes the package.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const read = (/** @type {string} */ p) => readFileSync(new URL(p, import.meta.url), "utf8");

test("the package ships its licence and says what it is", () => {
  const pkg = JSON.parse(read("../package.json"));
  assert.equal(pkg.license, "Apache-2.0");
  assert.match(read("../LICENSE"), /^\s*Apache License\s+Version 2\.0, January 2004/);
  assert.ok(pkg.files.includes("LICENSE"));
  for (const word of ["websocket", "pubsub", "herald"]) assert.ok(pkg.keywords.includes(word), word);
  assert.equal(pkg.types, "./types/herald-client.d.ts");
});
