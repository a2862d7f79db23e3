#!/usr/bin/env bash
# Two herald nodes joined through a local nats-server, and the bench against them: the
# publisher on node 1, subscribers alternating between node 1 and node 2 (`--sub-url`).
# Node 1 is pinned to core 0, node 2 and nats-server share core 1 with the bench (2 cores).
#
#   bench/run-cluster.sh [HERALD_BIN] [OUT_DIR] -- <extra herald bench args>
#
# Runs the VBDS image scenario and Solace 3.1.2 (small scale), writing Markdown and JSON to
# OUT_DIR (default bench/results) with a `-2nodes` suffix.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../target/release/herald}"
out="${2:-$here/results}"
mkdir -p "$out"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
np=$(port); p1=$(port); p2=$(port)
store=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$store"; }
trap cleanup EXIT
nats_server=$(command -v nats-server || echo /usr/sbin/nats-server)
taskset -c 1 "$nats_server" -a 127.0.0.1 -p "$np" -js -sd "$store" >/dev/null 2>&1 & pids+=($!)
sleep 0.5
serve() { # core, port
    taskset -c "$1" "$bin" serve --listen "127.0.0.1:$2" --nats "nats://127.0.0.1:$np" \
        --max-outbound-bytes 134217728 --log warn & pids+=($!)
}
serve 0 "$p1"; serve 1 "$p2"
sleep 1
urls=(--url "ws://127.0.0.1:$p1/ws" --sub-url "ws://127.0.0.1:$p1/ws" --sub-url "ws://127.0.0.1:$p2/ws")
run() { # name, extra args...
    local name="$1"; shift
    echo "== $name (2 nodes) $*" >&2
    taskset -c 1 "$bin" bench "$here/scenarios/$name.toml" "${urls[@]}" \
        --json "$out/$name-2nodes.json" --markdown "$out/$name-2nodes.md" "$@"
}
run vbds-images --set duration=10 --sweep image_side=48,128,512,1024,2048
run solace-3.1.2-very-high --set warmup=3 --set duration=10 --sweep clients=100,300,500
