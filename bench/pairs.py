#!/usr/bin/env python3
"""The table of interleaved benchmark rounds: each run's medians over the rounds, and the ratios
of the first run to each of the others (p99.9, p50 and the server's CPU per delivery).

Reads the reports `herald bench --json` wrote as DIR/r<round>-<name>.json (as
bench/mqtt-vs-mosquitto.sh and bench/reference-pairs.sh name them):

    bench/pairs.py --out DIR --rounds R [--title T] FIRST OTHER [OTHER ...]
"""

import argparse
import json
import os
import statistics


def step(out, name, r):
    path = os.path.join(out, f"r{r}-{name}.json")
    if not os.path.exists(path):
        return None
    rep = json.load(open(path))
    if not rep["steps"]:
        return None
    s = rep["steps"][0]
    s["loopback"] = rep["machine"].get("loopback_write_us")
    return s


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, d=0):
    return "-" if x is None else f"{x:,.{d}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--title", default="Interleaved rounds")
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    medians = {}
    print(f"\n{a.title}, medians over {a.rounds} round(s); reports in {a.out}\n")
    print("| run | rounds | egress achieved (expected) msg/s | mean (µs) | p50 (µs) | p99 (µs) | p99.9 (µs) | p99.9 by round (µs) | server CPU | server CPU per delivery (µs) | lost / dup / ooo | bench saturated | loopback write (µs) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for n in a.names:
        ss = [s for s in (step(a.out, n, r) for r in range(1, a.rounds + 1)) if s]
        if not ss:
            print(f"| {n} | 0 | no report | | | | | | | | | | |")
            continue
        lat = lambda k: med([s["latency_us"][k] for s in ss])
        m = {
            "p999": lat("p999"),
            "p50": lat("p50"),
            "cpu": med([s.get("server_cpu_us_per_delivery") for s in ss]),
        }
        medians[n] = m
        cores = med([s.get("server_cpu_cores") for s in ss])
        print(
            f"| {n} | {len(ss)} | {fmt(med([s['egress_achieved'] for s in ss]))} ({fmt(ss[0]['egress_expected'])}) "
            f"| {fmt(lat('mean'))} | {fmt(m['p50'])} | {fmt(lat('p99'))} | {fmt(m['p999'])} "
            f"| {', '.join(fmt(s['latency_us']['p999']) for s in ss)} "
            f"| {fmt(cores * 100 if cores is not None else None)}% "
            f"| {fmt(m['cpu'], 2)} "
            f"| {sum(s['lost'] for s in ss)} / {sum(s['duplicates'] for s in ss)} / {sum(s['out_of_order'] for s in ss)} "
            f"| {sum(bool(s['bench_cpu_saturated']) for s in ss)} of {len(ss)} "
            f"| {fmt(med([s['loopback'] for s in ss]), 1)} |"
        )
    print()
    first = a.names[0]
    for other in a.names[1:]:
        if first in medians and other in medians:
            ratio = lambda k: (
                f"{medians[first][k] / medians[other][k]:.2f}×"
                if medians[first][k] and medians[other][k] else "-"
            )
            print(f"- {first} / {other}: p99.9 {ratio('p999')}, p50 {ratio('p50')}, server CPU per delivery {ratio('cpu')}")


if __name__ == "__main__":
    main()
