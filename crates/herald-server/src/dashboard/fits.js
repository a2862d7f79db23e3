// FITS images decoded in the browser: the primary header's 80-character cards, big-endian data
// of BITPIX 8, 16, 32, -32 or -64, physical values BZERO + BSCALE × raw, linear (min–max) or
// zscale-like limits, and a colour map. No DOM here, so Node can test it too.

const BLOCK = 2880;
const CARD = 80;

/**
 * @typedef {object} Fits
 * @property {string[]} cards  The header as written (trailing blanks trimmed), up to END.
 * @property {Record<string, string | number | boolean>} header  Values by keyword.
 * @property {number} bitpix
 * @property {number} width  NAXIS1
 * @property {number} height  NAXIS2
 * @property {number} bzero
 * @property {number} bscale
 * @property {number} dataOffset  Where the data starts (after the header's 2880-byte blocks).
 */

/** True if `bytes` start like a FITS file. @param {Uint8Array} bytes */
export function isFits(bytes) {
  return bytes.length >= CARD && String.fromCharCode(...bytes.subarray(0, 6)) === "SIMPLE";
}

/**
 * Parses the primary header.
 * @param {Uint8Array} bytes
 * @returns {Fits}
 */
export function parseFits(bytes) {
  if (!isFits(bytes)) throw new Error("not a FITS file: it does not start with SIMPLE");
  /** @type {string[]} */
  const cards = [];
  /** @type {Record<string, string | number | boolean>} */
  const header = {};
  let end = -1;
  for (let at = 0; at + CARD <= bytes.length; at += CARD) {
    const card = String.fromCharCode(...bytes.subarray(at, at + CARD));
    const key = card.slice(0, 8).trim();
    cards.push(card.trimEnd());
    if (key === "END") {
      end = at + CARD;
      break;
    }
    if (card.slice(8, 10) === "= ") header[key] = parseValue(card.slice(10));
  }
  if (end < 0) throw new Error("FITS header has no END card");
  const num = (/** @type {string} */ k, /** @type {number} */ d) => (typeof header[k] === "number" ? /** @type {number} */ (header[k]) : d);
  const fits = {
    cards,
    header,
    bitpix: num("BITPIX", 0),
    width: num("NAXIS1", 0),
    height: num("NAXIS", 0) >= 2 ? num("NAXIS2", 0) : 1,
    bzero: num("BZERO", 0),
    bscale: num("BSCALE", 1),
    dataOffset: Math.ceil(end / BLOCK) * BLOCK,
  };
  if (![8, 16, 32, -32, -64].includes(fits.bitpix)) throw new Error(`unsupported BITPIX ${fits.bitpix}`);
  if (num("NAXIS", 0) < 1 || fits.width <= 0 || fits.height <= 0) throw new Error("FITS header has no image (NAXIS)");
  const need = fits.dataOffset + fits.width * fits.height * (Math.abs(fits.bitpix) / 8);
  if (bytes.length < need) throw new Error(`FITS data truncated: ${bytes.length} bytes, the header needs ${need}`);
  return fits;
}

/** A header value: 'string', T/F, or a number; comments after '/' dropped. @param {string} raw */
function parseValue(raw) {
  const s = raw.trim();
  if (s.startsWith("'")) {
    const close = s.indexOf("'", 1);
    return s.slice(1, close < 0 ? undefined : close).trimEnd();
  }
  const v = s.split("/")[0].trim();
  if (v === "T") return true;
  if (v === "F") return false;
  const n = Number(v.replace(/D/g, "E"));
  return Number.isNaN(n) ? v : n;
}

/**
 * Reads raw pixel `i` (row-major from the first row in the file) as a physical value.
 * @param {Fits} f @param {DataView} view
 * @returns {(i: number) => number}
 */
function reader(f, view) {
  const o = f.dataOffset;
  const z = f.bzero, s = f.bscale;
  switch (f.bitpix) {
    case 8: return (i) => z + s * view.getUint8(o + i);
    case 16: return (i) => z + s * view.getInt16(o + 2 * i);
    case 32: return (i) => z + s * view.getInt32(o + 4 * i);
    case -32: return (i) => z + s * view.getFloat32(o + 4 * i);
    default: return (i) => z + s * view.getFloat64(o + 8 * i);
  }
}

/**
 * The display limits: `linear` spans min..max of every pixel; `zscale` follows IRAF's idea on a
 * sample of about 10,000 pixels: fit a line to the sorted sample's middle half, and span the
 * median ± (n/2)·slope/contrast, clipped to the sample's range. Sky images come out with
 * contrast where min–max would show a few hot pixels on black.
 * @param {Fits} f @param {Uint8Array} bytes @param {"linear" | "zscale"} mode
 * @returns {[number, number]}
 */
export function limits(f, bytes, mode) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const at = reader(f, view);
  const n = f.width * f.height;
  const step = mode === "linear" ? 1 : Math.max(1, Math.floor(n / 10_000));
  const sample = [];
  let lo = Infinity, hi = -Infinity;
  for (let i = 0; i < n; i += step) {
    const v = at(i);
    if (Number.isNaN(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
    if (mode === "zscale") sample.push(v);
  }
  if (lo === Infinity) return [0, 1];
  if (mode === "linear" || sample.length < 4) return [lo, hi];
  sample.sort((a, b) => a - b);
  const m = sample.length;
  const median = sample[m >> 1];
  const from = Math.floor(m / 4), to = Math.floor((3 * m) / 4);
  let sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (let i = from; i < to; i++) {
    sx += i; sy += sample[i]; sxx += i * i; sxy += i * sample[i];
  }
  const k = to - from;
  const slope = (k * sxy - sx * sy) / (k * sxx - sx * sx || 1);
  const contrast = 0.25;
  const z1 = Math.max(lo, median - ((m / 2) * slope) / contrast);
  const z2 = Math.min(hi, median + ((m / 2) * slope) / contrast);
  return z2 > z1 ? [z1, z2] : [lo, hi];
}

/** Control points of the colour maps (0..1 → RGB). */
const MAPS = {
  grey: [[0, 0, 0, 0], [1, 255, 255, 255]],
  heat: [[0, 0, 0, 0], [0.35, 170, 20, 0], [0.7, 255, 170, 0], [1, 255, 255, 230]],
  viridis: [[0, 68, 1, 84], [0.25, 59, 82, 139], [0.5, 33, 145, 140], [0.75, 94, 201, 98], [1, 253, 231, 37]],
};

/**
 * 256 colours as RGBA packed for a little-endian Uint32Array view of ImageData.
 * @param {keyof typeof MAPS} name
 */
export function colourMap(name) {
  const pts = MAPS[name] ?? MAPS.grey;
  const lut = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    const x = i / 255;
    let j = 1;
    while (j < pts.length - 1 && pts[j][0] < x) j++;
    const [x0, ...c0] = pts[j - 1], [x1, ...c1] = pts[j];
    const t = (x - x0) / (x1 - x0 || 1);
    const [r, g, b] = c0.map((c, k) => Math.round(c + (c1[k] - c) * t));
    lut[i] = (255 << 24) | (b << 16) | (g << 8) | r;
  }
  return lut;
}

/**
 * Paints the image into `out` (width × height RGBA pixels as Uint32, top row first: FITS
 * stores the bottom row first, so rows are flipped).
 * @param {Fits} f @param {Uint8Array} bytes @param {[number, number]} range @param {Uint32Array} cmap
 * @param {Uint32Array} out
 */
export function paint(f, bytes, [lo, hi], cmap, out) {
  const { width: w, height: h } = f;
  const k = 255 / (hi - lo || 1);
  const index = (/** @type {number} */ v) => (v <= lo ? 0 : v >= hi ? 255 : ((v - lo) * k) | 0);
  if (f.bitpix === 16) {
    // Every 16-bit value's colour in one table: the loop is then a byte swap and a lookup.
    const lut = new Uint32Array(65536);
    for (let r = 0; r < 65536; r++) lut[r] = cmap[index(f.bzero + f.bscale * ((r << 16) >> 16))];
    let o = f.dataOffset;
    for (let y = h - 1; y >= 0; y--) {
      let p = y * w;
      const endRow = p + w;
      while (p < endRow) {
        out[p++] = lut[(bytes[o] << 8) | bytes[o + 1]];
        o += 2;
      }
    }
    return;
  }
  const at = reader(f, new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  let i = 0;
  for (let y = h - 1; y >= 0; y--) {
    for (let x = 0, p = y * w; x < w; x++, p++, i++) {
      const v = at(i);
      out[p] = Number.isNaN(v) ? 0xff000000 : cmap[index(v)];
    }
  }
}
