#!/usr/bin/env bash
# Issue 4, target 12: herald under twice the load it holds, for minutes, then back to normal.
#
# One herald (pinned to core 0, per-connection backlog limited to OUTBOUND bytes) serves three
# `herald bench` runs of the Solace 3.1.2 workload (20,000 topics, 100 subscriptions per client,
# 50-byte messages), the bench pinned to core 1:
#   1. baseline  CLIENTS subscribers, 20,000 msg/s published (100 msg/s per client), 20 s;
#   2. overload  the same subscribers at FACTOR times the publish rate, for OVERLOAD seconds;
#   3. recovery  the baseline load again at once, measured after the same 3 s warm-up as the
#                baseline; beside it, from the moment the overload ends, a light probe (10
#                subscribers on topics of their own) measures latency in 2-s windows for
#                PROBE_SECS (default 30): how many seconds herald takes to recover.
# Meanwhile herald's RSS is sampled every second. Printed: each phase's bench table, RSS after
# each phase and its peak during the overload beside the queue bound the configuration implies
# (connections × OUTBOUND; topic history is bounded apart, per topic), whether herald is still
# running, and what it shed, from /metrics (disconnects by reason, policy actions, drops).
#
# Usage: bench/overload.sh [HERALD_BIN]   (default target/release/herald)
#        CLIENTS=1000 FACTOR=2 OVERLOAD=300 OUTBOUND=262144 PROBE_SECS=30 PORT=18099 bench/overload.sh
set -euo pipefail
cd "$(dirname "$0")/.."
herald="${1:-target/release/herald}"
clients="${CLIENTS:-1000}"
factor="${FACTOR:-2}"
overload="${OVERLOAD:-300}"
outbound="${OUTBOUND:-262144}"
port="${PORT:-18099}"
[ -x "$herald" ] || { echo "no herald binary at $herald (cargo build --release)" >&2; exit 2; }

work="$(mktemp -d)"
server=""
sampler=""
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  [ -n "$server" ] && kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/herald.toml" <<EOF
max_outbound_bytes = $outbound
EOF
taskset -c 0 "$herald" serve --listen "127.0.0.1:$port" --config "$work/herald.toml" \
  --log warn >"$work/herald.log" 2>&1 &
server=$!
for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null || { cat "$work/herald.log" >&2; exit 1; }

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
shed() { # the counters of what herald refused or cut
  curl -fsS "http://127.0.0.1:$port/metrics" |
    grep -E '^herald_(disconnects|policy_actions|dropped_messages|connections |deliveries_total|messages_in_total)' || true
}
phase() { # phase NAME RATE DURATION WARMUP
  echo "## $1: $clients clients, $2 msg/s published, ${3} s (warm-up $4 s)"
  taskset -c 1 "$herald" bench bench/scenarios/solace-3.1.2-very-high.toml \
    --url "ws://127.0.0.1:$port/ws" --clients "$clients" --set "rate=$2" \
    --duration "$3" --set "warmup=$4" 2>&1 | grep -E '^\||saturated|closed|lost' || true
}

base=$(rss_kib)
rate=20000
phase baseline "$rate" 20 3
after_baseline=$(rss_kib)
echo "## /metrics after the baseline"
shed

while kill -0 "$server" 2>/dev/null; do rss_kib; sleep 1; done >"$work/rss" 2>/dev/null &
sampler=$!
phase overload "$((rate * factor))" "$overload" 3
kill "$sampler" 2>/dev/null || true
sampler=""
echo "## /metrics after the overload"
shed

# Latency second by second once the load falls: a light probe (10 subscribers, 200 msg/s on
# topics of their own) runs back to back in 2-s windows from the moment the overload ends,
# beside the recovery phase.
probe() {
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt "$PROBE_SECS" ]; do
    local at=$((SECONDS - start))
    taskset -c 1 "$herald" bench --kind fanout --url "ws://127.0.0.1:$port/ws" --clients 10 \
      --topics 10 --subs 1 --publishers 1 --rate 200 --payload 50 --warmup 0 --duration 2 \
      --set topic_prefix=probe 2>&1 |
      sed -nE "s/^clients 10: .*latency µs mean [0-9.]+ (p50 [0-9]+ p99 [0-9]+).*/probe +${at} s: \1 µs/p"
  done
}
PROBE_SECS="${PROBE_SECS:-30}"
probe >"$work/probe" &
prober=$!
phase recovery "$rate" 20 3
wait "$prober" || true
echo "## probe after the overload (10 subscribers, 200 msg/s; 2-s windows from the moment it ended)"
cat "$work/probe"
after_recovery=$(rss_kib)
alive=no
kill -0 "$server" 2>/dev/null && curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null && alive=yes
peak=$(sort -n "$work/rss" | tail -1)
echo "## herald still running: $alive"
echo "## RSS (KiB): at start ${base}, after the baseline ${after_baseline}, peak during the overload ${peak:-?}, after the recovery ${after_recovery}"
echo "## queue bound from the config: connections × max_outbound_bytes = $clients × $outbound B = $((clients * outbound / 1024)) KiB"
echo "## (history is bounded apart: 20,000 topics × 32 messages by default, reached once every topic has had 32)"
echo "## /metrics at the end"
shed
