// Writes FITS files for the tests and the display-rate measurement (the dashboard only reads them).

const BLOCK = 2880;
const CARD = 80;

/**
 * Writes a FITS file (tests and demos): BITPIX 16 or -32, big-endian, header padded to 2880.
 * @param {number} width @param {number} height @param {16 | -32} bitpix
 * @param {(x: number, y: number) => number} value  raw value at (x, y), y = 0 the first row stored
 * @param {Record<string, number | string>} [extra]  more header cards
 */
export function writeFits(width, height, bitpix, value, extra = {}) {
  const card = (/** @type {string} */ k, /** @type {string} */ v) => (k.padEnd(8) + "= " + v.padStart(20)).padEnd(CARD);
  const cards = [card("SIMPLE", "T"), card("BITPIX", String(bitpix)), card("NAXIS", "2"), card("NAXIS1", String(width)), card("NAXIS2", String(height))];
  for (const [k, v] of Object.entries(extra)) cards.push(card(k, typeof v === "string" ? `'${v}'` : String(v)));
  cards.push("END".padEnd(CARD));
  const head = Math.ceil((cards.length * CARD) / BLOCK) * BLOCK;
  const size = head + Math.ceil((width * height * (Math.abs(bitpix) / 8)) / BLOCK) * BLOCK;
  const bytes = new Uint8Array(size);
  bytes.fill(32, 0, head);
  cards.forEach((c, i) => { for (let j = 0; j < CARD; j++) bytes[i * CARD + j] = c.charCodeAt(j); });
  const view = new DataView(bytes.buffer);
  for (let y = 0, i = 0; y < height; y++) {
    for (let x = 0; x < width; x++, i++) {
      if (bitpix === 16) view.setInt16(head + 2 * i, value(x, y));
      else view.setFloat32(head + 4 * i, value(x, y));
    }
  }
  return bytes;
}
