// The dashboard's FITS decoder (crates/herald-server/src/dashboard/fits.js) without a browser.

import { test } from "node:test";
import assert from "node:assert/strict";
import { isFits, parseFits, limits, colourMap, paint } from "../../../crates/herald-server/src/dashboard/fits.js";
import { writeFits } from "./fits-writer.js";

test("header cards, values and the data offset", () => {
  const f = parseFits(writeFits(3, 2, 16, (x, y) => x + 10 * y, { BZERO: 32768, OBJECT: "M31", EXPTIME: 1.5 }));
  assert.equal(f.bitpix, 16);
  assert.equal(f.width, 3);
  assert.equal(f.height, 2);
  assert.equal(f.bzero, 32768);
  assert.equal(f.header.OBJECT, "M31");
  assert.equal(f.header.EXPTIME, 1.5);
  assert.equal(f.header.SIMPLE, true);
  assert.equal(f.dataOffset, 2880);
  assert.equal(f.cards.at(-1), "END");
});

test("16-bit values are big-endian, scaled by BZERO, rows flipped", () => {
  const bytes = writeFits(2, 2, 16, (x, y) => (y === 0 ? [-100, 100][x] : 0), { BZERO: 1000 });
  const f = parseFits(bytes);
  assert.deepEqual(limits(f, bytes, "linear"), [900, 1100]);
  const out = new Uint32Array(4);
  const grey = colourMap("grey");
  paint(f, bytes, [900, 1100], grey, out);
  // The first stored row (y = 0) is the bottom row on screen.
  assert.deepEqual([...out], [grey[127], grey[127], grey[0], grey[255]]);
});

test("32-bit floats, NaN shown as black", () => {
  const bytes = writeFits(2, 1, -32, (x) => (x === 0 ? NaN : 2.5));
  const f = parseFits(bytes);
  assert.deepEqual(limits(f, bytes, "linear"), [2.5, 2.5]);
  const out = new Uint32Array(2);
  paint(f, bytes, [0, 5], colourMap("grey"), out);
  assert.equal(out[0], 0xff000000);
  assert.equal(out[1] & 0xff, 127);
});

test("zscale ignores a few outliers that min–max would stretch to", () => {
  const n = 200;
  const bytes = writeFits(n, n, 16, (x, y) => ((x * 7 + y * 13) % 100) + (x === 5 && y === 5 ? 30000 : 0));
  const f = parseFits(bytes);
  const [lo, hi] = limits(f, bytes, "zscale");
  assert.ok(lo >= 0 && hi < 200, `zscale ${lo}..${hi}`);
  assert.equal(limits(f, bytes, "linear")[1], 30000 + ((5 * 7 + 5 * 13) % 100));
});

test("broken files are refused with a reason", () => {
  assert.equal(isFits(new TextEncoder().encode("GIF89a")), false);
  assert.throws(() => parseFits(new Uint8Array(100)), /SIMPLE/);
  const good = writeFits(4, 4, 16, () => 1);
  assert.throws(() => parseFits(good.subarray(0, 2880 + 10)), /truncated/);
  const noEnd = good.slice(0, 2880);
  noEnd.set(new TextEncoder().encode("COMMENT "), 5 * 80);
  assert.throws(() => parseFits(noEnd), /END/);
  const bad = writeFits(1, 1, 16, () => 1);
  bad.set(new TextEncoder().encode("BITPIX  =                   12"), 80);
  assert.throws(() => parseFits(bad), /BITPIX 12/);
});
