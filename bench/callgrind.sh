#!/usr/bin/env bash
# CPU cost of herald per published and per delivered message, in instructions counted by
# valgrind's callgrind: repeatable whatever else the machine is doing, unlike seconds.
#
# herald runs under callgrind twice with the same fixed fan-out load (herald bench: 100
# subscribers × 10 subscriptions over 100 topics, so each message reaches 10 subscribers, one
# publisher at 300 msg/s, 50-byte text), once for SHORT and once for LONG seconds. The
# difference between the two totals, divided by the difference in messages (from herald's own
# /metrics), cancels start-up, connection and shutdown costs and leaves the steady state.
#
# LOAD=ingest measures taking messages in alone: one publisher sending 16-byte text round-robin
# over 1,000 topics at RATE (default 5,000) msg/s and no subscriber (bench/scenarios/
# conflation.toml with clients = 0); LOAD=conflate adds its one `conflate`, max_rate = 2
# subscriber on every topic. LOAD=discard is ingest with the topics keeping only their last
# value, as the filtering scenario's unsubscribed topics do (issue 4, target 5: a discard).
# All three print instructions per message published.
#
# PROTOCOL=mqtt (or stomp) runs the fanout load with the publisher and the subscribers
# speaking that protocol over WebSocket (/mqtt, /stomp) instead of herald's own (/ws): the
# cost per delivery of a protocol beside the native path's.
#
# Usage: bench/callgrind.sh [HERALD_BIN]   (default target/release/herald)
#        SHORT=5 LONG=15 RATE=300 PORT=18091 bench/callgrind.sh
#        LOAD=ingest bench/callgrind.sh   or LOAD=conflate, LOAD=discard
#        KEEP=DIR bench/callgrind.sh   keeps the callgrind profiles (callgrind_annotate DIR/…)
# Prints one Markdown table row; commit it in bench/RESULTS.md with the commit it measured.
set -euo pipefail
cd "$(dirname "$0")/.."

herald="${1:-target/release/herald}"
short="${SHORT:-5}"
long="${LONG:-15}"
load="${LOAD:-fanout}"
case "$load" in
  fanout) rate="${RATE:-300}" ;;
  ingest | conflate | discard) rate="${RATE:-5000}" ;;
  *) echo "LOAD must be fanout, ingest, conflate or discard, not $load" >&2; exit 2 ;;
esac
port="${PORT:-18091}"
protocol="${PROTOCOL:-native}"
case "$protocol" in
  native) path=/ws ;;
  mqtt | stomp) path="/$protocol"
    [ "$load" = fanout ] || { echo "PROTOCOL applies to LOAD=fanout only" >&2; exit 2; } ;;
  *) echo "PROTOCOL must be native, mqtt or stomp, not $protocol" >&2; exit 2 ;;
esac
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
[ -x "$herald" ] || { echo "no herald binary at $herald (cargo build --release)" >&2; exit 2; }

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/callgrind.* "$KEEP"/; fi
  rm -rf "$work"
}
trap cleanup EXIT

metric() { # metric NAME: the value of an unlabelled counter from /metrics
  curl -fsS "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}

# run SECONDS: prints "instructions messages_in deliveries"
run() {
  local out="$work/callgrind.$1"
  # One core, hence one tokio worker thread: the production benchmark's placement, and the
  # same scheduling in every run.
  # herald's per-connection frame limit (100,000/s by default) is lifted, as the conflation
  # scenario does, so that a publisher is never throttled.
  printf '[limits]\nmax_messages_per_sec = 0\nmax_bytes_per_sec = 0\n' >"$work/herald.toml"
  if [ "$load" = discard ]; then
    printf '[[history]]\npattern = ">"\nmax_messages = 0\n' >>"$work/herald.toml"
  fi
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out" --dump-instr=no \
    "$herald" serve --listen "127.0.0.1:$port" --log warn --config "$work/herald.toml" \
    >"$work/valgrind.$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  local load_args
  if [ "$load" = fanout ]; then
    load_args=(--kind fanout --clients 100 --topics 100 --subs 10 --publishers 1
      --rate "$rate" --payload 50 --warmup 0 --duration "$1" --set "protocol=$protocol")
  else
    load_args=(bench/scenarios/conflation.toml --set "clients=$([ "$load" = conflate ] && echo 1 || echo 0)"
      --set publishers=1 --set "rate=$rate" --set warmup=0 --set "duration=$1")
  fi
  taskset -c 1 "$herald" bench "${load_args[@]}" --url "ws://127.0.0.1:$port$path" \
    >"$work/bench.$1.log" 2>&1 || { cat "$work/bench.$1.log" >&2; exit 1; }
  local msgs deliveries
  msgs="$(metric 'herald_messages_in_total{source="ws"}')"
  deliveries="$(metric herald_deliveries_total)"
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=""
  local instructions
  instructions="$(awk '/^(summary|totals):/ { print $2; exit }' "$out")"
  echo "$instructions ${msgs%.*} ${deliveries%.*}"
}

read -r i1 m1 d1 < <(run "$short")
read -r i2 m2 d2 < <(run "$long")
python3 - "$load" "$i1" "$m1" "$d1" "$i2" "$m2" "$d2" <<'EOF'
import sys
load = sys.argv[1]
i1, m1, d1, i2, m2, d2 = map(int, sys.argv[2:])
dm, dd, di = m2 - m1, d2 - d1, i2 - i1
print(f"runs: {m1} msgs / {d1} deliveries / {i1:,} instr; {m2} / {d2} / {i2:,}")
if load == "fanout":
    print("| messages | deliveries | instructions per message published | per delivery (fan-out 10) |")
    print("|---:|---:|---:|---:|")
    print(f"| {dm:,} | {dd:,} | {di / dm:,.0f} | {di / dd:,.0f} |")
else:
    print(f"| load | messages | instructions per message published |")
    print("|---|---:|---:|")
    print(f"| {load} | {dm:,} | {di / dm:,.0f} |")
EOF
