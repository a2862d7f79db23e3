// Numbers for people: short, fixed-width-friendly, with units.

/** 1234 → "1.23k", 0.5 → "0.5". @param {number} n */
export function count(n) {
  if (!Number.isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
  if (a >= 100 || Number.isInteger(n)) return Math.round(n).toLocaleString("en");
  return n.toFixed(1);
}

/** Bytes with binary units. @param {number} n */
export function bytes(n) {
  if (!Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return (i === 0 ? Math.round(n) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}

/** Microseconds as µs / ms / s. @param {number} us */
export function micros(us) {
  if (!Number.isFinite(us)) return "–";
  if (Math.abs(us) < 1000) return Math.round(us) + " µs";
  if (Math.abs(us) < 1e6) return (us / 1000).toFixed(us < 1e4 ? 2 : 1) + " ms";
  return (us / 1e6).toFixed(2) + " s";
}

/** Seconds as "3d 4h", "5m 2s". @param {number} s */
export function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s % 60}s`;
  return `${s}s`;
}

/** Fills a two-column table from an object, or says "none". @param {HTMLElement} table @param {Record<string, number>} obj */
export function fillKv(table, obj) {
  const rows = Object.entries(obj ?? {}).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]);
  table.replaceChildren(
    ...(rows.length ? rows : [["none", NaN]]).map(([k, v]) => {
      const tr = document.createElement("tr");
      tr.append(cell(k), cell(Number.isNaN(v) ? "" : count(v), "n"));
      return tr;
    }),
  );
}

/** A table cell with text (never HTML: topics and payloads are untrusted). @param {string} text @param {string} [cls] */
export function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
