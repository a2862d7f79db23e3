// Small canvas charts sized to their element and the screen's pixel ratio.

/** Resizes the canvas backing store to its CSS size; returns the 2D context and size in CSS px.
 * @param {HTMLCanvasElement} canvas */
function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(h * ratio);
  }
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, w, h };
}

const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

/** A nice round axis maximum at or above `v`. @param {number} v */
function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= v) ?? 10 * p;
}

/** A y axis for values up to `max`: a round step (1, 2 or 5 × 10ⁿ, at least 1: rates of whole
 * messages) and the top, at most four steps up. @param {number} max */
function countAxis(max) {
  const step = Math.max(1, niceMax(max / 4));
  return { step, top: step * Math.max(1, Math.ceil(max / step)) };
}

/**
 * Lines over wall-clock time: the last `windowUs` up to `nowUs`. A point whose value is NaN
 * breaks its line (no data there).
 * @param {HTMLCanvasElement} canvas
 * @param {{points: [number, number][], color: string}[]} series  [time µs, value], oldest first
 * @param {{nowUs: number, windowUs: number, format: (v: number) => string}} opts
 */
export function lineChart(canvas, series, opts) {
  const { ctx, w, h } = prepare(canvas);
  const left = 48, bottom = 18, top = 6;
  const values = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => !Number.isNaN(v));
  const { step, top: max } = countAxis(Math.max(0, ...values));
  ctx.strokeStyle = "#e2e6ee";
  ctx.fillStyle = "#687286";
  ctx.textAlign = "right";
  for (let v = 0; v <= max; v += step) {
    const y = top + (h - top - bottom) * (1 - v / max);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(opts.format(v), left - 6, y + 4);
  }
  ctx.textAlign = "left";
  ctx.fillText(`−${Math.round(opts.windowUs / 60e6)} min`, left, h - 4);
  ctx.textAlign = "right";
  ctx.fillText("now", w, h - 4);
  const from = opts.nowUs - opts.windowUs;
  for (const s of series) {
    ctx.strokeStyle = css(s.color) || s.color;
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    let drawing = false;
    for (const [t, v] of s.points) {
      if (t < from || Number.isNaN(v)) {
        drawing = false;
        continue;
      }
      const x = left + ((w - left) * (t - from)) / opts.windowUs;
      const y = top + (h - top - bottom) * (1 - v / max);
      drawing ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
      drawing = true;
    }
    ctx.stroke();
  }
}

/**
 * Overlaid histograms on a shared logarithmic x axis (latencies span decades).
 * @param {HTMLCanvasElement} canvas
 * @param {{values: number[], color: string}[]} series  raw samples (µs)
 */
export function histogram(canvas, series) {
  const { ctx, w, h } = prepare(canvas);
  const left = 40, bottom = 18, top = 6, bins = 48;
  const all = series.flatMap((s) => s.values).filter((v) => v > 0);
  if (all.length === 0) {
    ctx.fillStyle = "#687286";
    ctx.fillText("no samples yet", left, h / 2);
    return;
  }
  let lo = Math.log10(Math.max(1, Math.min(...all))), hi = Math.log10(Math.max(...all));
  lo = Math.floor(lo * 2) / 2;
  hi = Math.max(lo + 0.5, Math.ceil(hi * 2) / 2);
  const counts = series.map((s) => {
    const c = new Array(bins).fill(0);
    for (const v of s.values) {
      const b = Math.floor(((Math.log10(Math.max(1, v)) - lo) / (hi - lo)) * bins);
      c[Math.min(bins - 1, Math.max(0, b))]++;
    }
    return c;
  });
  const max = niceMax(Math.max(...counts.flat()));
  const bw = (w - left) / bins;
  ctx.fillStyle = "#687286";
  ctx.textAlign = "center";
  for (let d = Math.ceil(lo); d <= hi; d++) {
    const label = ["1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s"][d] ?? `1e${d} µs`;
    // Centred on its tick, but never past either edge of the canvas.
    const half = ctx.measureText(label).width / 2;
    const x = Math.min(w - half, Math.max(half, left + ((d - lo) / (hi - lo)) * (w - left)));
    ctx.fillText(label, x, h - 4);
  }
  ctx.textAlign = "right";
  ctx.fillText(String(max), left - 6, top + 8);
  series.forEach((s, i) => {
    ctx.fillStyle = css(s.color) || s.color;
    ctx.globalAlpha = 0.6;
    counts[i].forEach((c, b) => {
      const bh = ((h - top - bottom) * c) / max;
      ctx.fillRect(left + b * bw + 1, h - bottom - bh, Math.max(1, bw - 2), bh);
    });
  });
  ctx.globalAlpha = 1;
}
