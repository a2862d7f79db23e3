#!/usr/bin/env bash
# Runs every seed scenario against a spawned herald and writes, per scenario, the Markdown
# table, the JSON report and the SVG plot into OUT_DIR (default bench/results).
#
#   bench/run-all.sh [HERALD_BIN] [OUT_DIR]
#
# SCALE=small (default) shortens the runs so that all of them fit in about half an hour on a
# 2-core machine (10 s measured per step, 5 proxy trials, images capped at 20 s per size);
# SCALE=full runs the scenario files as they are (several hours).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../target/release/herald}"
out="${2:-$here/results}"
scale="${SCALE:-small}"
mkdir -p "$out"

run() { # name, extra args...
    local name="$1"; shift
    echo "== $name $*" >&2
    "$bin" bench "$here/scenarios/$name.toml" --spawn-bin "$bin" \
        --json "$out/$name.json" --plot "$out/$name.svg" --markdown "$out/$name.md" "$@"
}

if [ "$scale" = full ]; then
    for s in solace-3.1.1-high solace-3.1.2-very-high solace-3.2-filtering solace-3.3-large \
             proxy-latency proxy-latency-stomp stock-exchange vbds-images; do
        run "$s"
    done
else
    short=(--set warmup=3 --set duration=10)
    run solace-3.1.1-high "${short[@]}"
    run solace-3.1.2-very-high "${short[@]}"
    # 1,000 clients as the baseline: 9,000 × 100 msg/s is more than one load core can receive.
    run solace-3.2-filtering "${short[@]}" --set clients=1000 \
        --sweep discard_rate=0,50000,100000,200000,400000
    run solace-3.3-large "${short[@]}"
    run proxy-latency --trials 5
    run proxy-latency-stomp --trials 5
    run stock-exchange --set duration=6
    run vbds-images --set duration=20
fi
