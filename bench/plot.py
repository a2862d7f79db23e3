#!/usr/bin/env python3
"""Draws the SVG plots of bench/RESULTS.md from the reports in bench/results/.

Python's standard library only; every point is a figure from a committed JSON report, nothing
is averaged or fitted. The plots the bench drew itself (`herald bench --plot`) stay as they
are; this script draws the ones it did not: runs gathered from several reports, herald
beside the C reference or beside a second node, and sweeps run without `--plot`.

    python3 bench/plot.py            # rewrites the SVGs named in PLOTS below
"""
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

W, H = 860, 520
LEFT, RIGHT, TOP, BOTTOM = 90, 660, 50, 450  # the plot area; the legend sits to its right
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def fmt(v):
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:g}"
    return f"{v:.2g}"


def svg(title, xlabel, ylabel, series, log_y, path, x_ticks=None):
    """series: list of (label, [(x, y)], style) with style "line" or "points"."""
    xs = [x for _, pts, _ in series for x, _ in pts]
    ys = [y for _, pts, _ in series for _, y in pts]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x1 = x0 + 1
    pad = (x1 - x0) * 0.04
    x0, x1 = x0 - pad, x1 + pad
    if log_y:
        y0 = 10 ** math.floor(math.log10(min(ys)))
        y1 = 10 ** math.ceil(math.log10(max(ys)))
        ty = lambda y: BOTTOM - (math.log10(y) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (BOTTOM - TOP)
        y_ticks = [10 ** e for e in range(int(math.log10(y0)), int(math.log10(y1)) + 1)]
    else:
        y0, y1 = 0, max(ys) * 1.08
        ty = lambda y: BOTTOM - (y - y0) / (y1 - y0) * (BOTTOM - TOP)
        step = 10 ** math.floor(math.log10(y1 / 2))
        while y1 / step > 8:
            step *= 2
        y_ticks = [i * step for i in range(int(y1 / step) + 1)]
    tx = lambda x: LEFT + (x - x0) / (x1 - x0) * (RIGHT - LEFT)
    if x_ticks is None:
        x_ticks = sorted(set(xs))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{(LEFT + RIGHT) / 2}" y="24" font-size="15" text-anchor="middle">{title}</text>',
    ]
    for y in y_ticks:
        out.append(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{ty(y):.1f}" y2="{ty(y):.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6}" y="{ty(y) + 4:.1f}" text-anchor="end">{fmt(y)}</text>')
    for x in x_ticks:
        out.append(f'<line x1="{tx(x):.1f}" x2="{tx(x):.1f}" y1="{TOP}" y2="{BOTTOM}" stroke="#eee"/>'
                   f'<text x="{tx(x):.1f}" y="{BOTTOM + 16}" text-anchor="middle">{fmt(x)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{(LEFT + RIGHT) / 2}" y="{BOTTOM + 40}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text transform="translate(20,{(TOP + BOTTOM) / 2}) rotate(-90)" text-anchor="middle">{ylabel}</text>')
    for i, (label, pts, style) in enumerate(series):
        c = COLOURS[i % len(COLOURS)]
        pts = sorted(pts)
        if style == "line" and len(pts) > 1:
            d = " ".join(f"{'M' if j == 0 else 'L'}{tx(x):.1f},{ty(y):.1f}" for j, (x, y) in enumerate(pts))
            out.append(f'<path d="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{tx(x):.1f}" cy="{ty(y):.1f}" r="3.5" fill="{c}" fill-opacity="0.75"/>')
        ly = TOP + 10 + i * 22
        out.append(f'<circle cx="{RIGHT + 20}" cy="{ly}" r="4" fill="{c}"/>'
                   f'<text x="{RIGHT + 30}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    with open(os.path.join(RESULTS, path), "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", os.path.join("bench", "results", path))


def rounds_beside_reference(runs, x, title, xlabel, path):
    """Plots each round's p50 and p99.9 of herald and the C reference (runs of
    bench/reference-pairs.sh, as its reports hold them) against `x` of the round's step."""
    series = {}
    for r in runs:
        s = r["step"]
        for q, name in (("p999", "p99.9"), ("p50", "p50")):
            series.setdefault(f'{r["server"]} {name}', []).append((x(s), s["latency_us"][q] / 1000))
    order = ["herald p99.9", "herald p50", "reference p99.9", "reference p50"]
    svg(title, xlabel, "latency (ms, log scale)",
        [(name.replace("reference", "C reference"), series[name], "points") for name in order],
        True, path)


def solace_clients():
    """Solace 3.1.2 at 1,000-9,000 clients: every round of bench/reference-pairs.sh, herald
    16c568e and the C reference interleaved (2026-11-29)."""
    rounds_beside_reference(
        load("solace-3.1.2-clients-16c568e.json")["runs"], lambda s: s["clients"],
        "Solace 3.1.2 (seed 003): latency by clients, each round (herald 16c568e, 2026-11-29)",
        "clients (100 deliveries/s each)", "solace-3.1.2-clients.svg")


def solace_rate():
    """1,000 clients with the publish rate raised: every round of bench/reference-pairs.sh
    --set rate=R, herald ae4ca23 and the C reference interleaved (2026-11-29)."""
    rounds_beside_reference(
        [r for st in load("solace-3.1.2-rate-ae4ca23.json")["sets"] for r in st["runs"]],
        lambda s: s["egress_expected"] / 1000,
        "1,000 clients, publish rate raised: latency of each round (herald ae4ca23, 2026-11-29)",
        "egress asked (thousand deliveries/s)", "solace-3.1.2-rate.svg")


def filtering():
    """Seed 003's input filtering beside 1,000 subscribers, session 12 (bench cfb3967)."""
    for r in load("session12.json")["runs"]:
        if r["label"].startswith("target 5: 1,000 clients, bench cfb3967"):
            steps = r["report"]["steps"]
    p50 = [(s["swept"]["discard_rate"] / 1000, s["latency_us"]["p50"]) for s in steps]
    p999 = [(s["swept"]["discard_rate"] / 1000, s["latency_us"]["p999"]) for s in steps]
    svg("Solace 3.2 (seed 003): 1,000 subscribers plus discards (2026-11-25)",
        "discards asked (thousand/s)", "latency (µs, log scale)",
        [("p50", p50, "line"), ("p99.9", p999, "line")], True, "solace-3.2-filtering-1000.svg")


def stock_exchange():
    """Seed 004, herald 18f2f2e (session 8): orders offered and taken by clients."""
    steps = load("stock-exchange-session8.json")["steps"]
    offered = [(s["clients"], s["publish_expected"] / 1000) for s in steps]
    taken = [(s["clients"], s["extra"]["tx_per_s"] / 1000) for s in steps]
    svg("Seed 004 stock exchange: orders per second (herald 18f2f2e, 2026-11-24)",
        "clients (10% of them traders)", "thousand orders/s (tx/s)",
        [("offered", offered, "line"), ("taken by herald", taken, "line")],
        False, "stock-exchange-session8.svg")



def two_nodes():
    """Two herald nodes through NATS beside one node in the same minutes (herald 3eeeab5,
    2026-11-23, a noisy machine: one run each)."""
    def rate(name):
        return [(s["swept"]["image_side"], s["publish_rate"]) for s in load(name)["steps"]]
    svg("Seed 001 images, one subscriber on each node (herald 3eeeab5, 2026-11-23)",
        "image side (pixels, 2 bytes each)", "images/s (log scale)",
        [("2 nodes through NATS", rate("vbds-images-2nodes.json"), "line"),
         ("1 node, same minutes", rate("vbds-images-1node-same-time.json"), "line")],
        True, "vbds-images-2nodes.svg")

    def lat(name, q):
        return [(s["clients"], s["latency_us"][q] / 1000) for s in load(name)["steps"]]
    two, one = "solace-3.1.2-very-high-2nodes.json", "solace-3.1.2-very-high-1node-same-time.json"
    svg("Solace 3.1.2, subscribers split over two nodes (herald 3eeeab5, 2026-11-23)",
        "clients", "latency (ms, log scale)",
        [("2 nodes p99.9", lat(two, "p999"), "line"), ("2 nodes p50", lat(two, "p50"), "line"),
         ("1 node p99.9", lat(one, "p999"), "line"), ("1 node p50", lat(one, "p50"), "line")],
        True, "solace-3.1.2-very-high-2nodes.svg")


def large_messages():
    """Seed 003's 1 KB and 2 KB messages at 1,000 and 2,000 clients (herald b060e79)."""
    series = []
    for name, size in (("solace-3.3-large-1k-session9.json", "1 KB"),
                       ("solace-3.3-large-2k-session9.json", "2 KB")):
        steps = load(name)["steps"]
        series.append((f"{size} p99.9", [(s["clients"], s["latency_us"]["p999"] / 1000) for s in steps], "line"))
        series.append((f"{size} p50", [(s["clients"], s["latency_us"]["p50"] / 1000) for s in steps], "line"))
    svg("Solace 3.3 large messages (herald b060e79, 2026-11-25)", "clients",
        "latency (ms, log scale)", series, True, "solace-3.3-large-session9.svg")


PLOTS = [solace_clients, solace_rate, filtering, stock_exchange, two_nodes, large_messages]

if __name__ == "__main__":
    for p in PLOTS:
        p()
