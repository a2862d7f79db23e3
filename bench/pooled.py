#!/usr/bin/env python3
"""One figure from several sets of interleaved rounds: the ratio FIRST / SECOND of a metric in
every round (each round's two runs minutes apart at most), pooled over the sets, with its
median, a 95% interval of that median (bootstrap over the rounds) and how many rounds are at
or below 1.0.

One set's median moves with the host from one hour to the next, the reference's as much as
herald's; the rounds of many sets together say how far apart the two servers are, and how
sure that is, better than any one set.

Reads the reports `herald bench --json` wrote as DIR/r<round>-<name>.json (as
bench/reference-pairs.sh and bench/profile-pairs.sh name them), or the sets of a results file
(bench/results/*.json: `{"sets": [{"command": ..., "runs": [{"server", "round", "step"}]}]}`)
whose command MATCH (a regular expression) finds:

    bench/pooled.py DIR [DIR ...]
    bench/pooled.py --results bench/results/solace-3.1.2-d60275e.json \
        --match 'pairs\.sh --rounds \d \(herald d60275e\)'
"""

import argparse
import glob
import json
import os
import random
import re
import statistics


def load(path):
    """The JSON in `path`, or a clear error naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: {e}")


def rounds_of_dirs(dirs):
    """{(set, round): {server: step}} from round directories."""
    rounds = {}
    for d in dirs:
        for path in glob.glob(os.path.join(d, "r*-*.json")):
            m = re.fullmatch(r"r(\d+)-(.+)\.json", os.path.basename(path))
            if not m:
                continue
            steps = load(path).get("steps")
            if steps:
                rounds.setdefault((d, int(m.group(1))), {})[m.group(2)] = steps[0]
    return rounds


def rounds_of_results(path, match):
    """{(set, round): {server: step}} from the sets of a results file whose command `match`
    (a regular expression) finds."""
    rounds = {}
    for i, s in enumerate(load(path).get("sets", [])):
        if not re.search(match, s["command"]):
            continue
        for run in s["runs"]:
            rounds.setdefault((i, run["round"]), {})[run["server"]] = run["step"]
    return rounds


def field(step, path):
    """`step`'s field at the dotted `path`, or None."""
    for key in path.split("."):
        step = step.get(key) if isinstance(step, dict) else None
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", help="round directories")
    ap.add_argument("--results", help="a results file instead of round directories")
    ap.add_argument("--match", default="", help="with --results: sets whose command this regular expression finds")
    ap.add_argument("--first", default="herald")
    ap.add_argument("--second", default="reference")
    ap.add_argument("--metric", default="server_cpu_us_per_delivery",
                    help="a field of a report's step, dotted for one inside another "
                         "(default: server_cpu_us_per_delivery; e.g. latency_us.p999)")
    ap.add_argument("--resamples", type=int, default=10000)
    a = ap.parse_args()
    if bool(a.dirs) == bool(a.results):
        ap.error("give round directories or --results, not both")
    rounds = rounds_of_results(a.results, a.match) if a.results else rounds_of_dirs(a.dirs)
    ratios = []
    for key in sorted(rounds, key=str):
        pair = rounds[key]
        if a.first in pair and a.second in pair:
            x, y = field(pair[a.first], a.metric), field(pair[a.second], a.metric)
            if x is not None and y:
                ratios.append(x / y)
    if not ratios:
        raise SystemExit(f"no round has both {a.first} and {a.second} with {a.metric}")
    rng = random.Random(1)  # the same interval every time for the same rounds
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(a.resamples))
    low, high = medians[int(0.025 * a.resamples)], medians[int(0.975 * a.resamples) - 1]
    at_or_below = sum(r <= 1.0 for r in ratios)
    print(f"{a.first} / {a.second}, {a.metric}: median {statistics.median(ratios):.3f} over "
          f"{len(ratios)} rounds (95% interval of the median {low:.3f}-{high:.3f}); "
          f"{at_or_below} of {len(ratios)} at or below 1.0")


if __name__ == "__main__":
    main()
