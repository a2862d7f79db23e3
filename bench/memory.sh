#!/usr/bin/env bash
# herald's resident memory per connection: RSS growth of `herald serve` divided by the
# connections open when it was sampled, while `herald bench` holds CLIENTS subscribers with
# SUBS subscriptions each over 20,000 topics (a trickle of 10 msg/s keeps them honest).
#
# Usage: bench/memory.sh [CLIENTS] [SUBS] [HERALD_BIN]   (defaults 3000 100 target/release/herald)
set -euo pipefail
cd "$(dirname "$0")/.."
clients="${1:-3000}"
subs="${2:-100}"
herald="${3:-target/release/herald}"
port="${PORT:-18095}"
[ -x "$herald" ] || { echo "no herald binary at $herald (cargo build --release)" >&2; exit 2; }

"$herald" serve --listen "127.0.0.1:$port" --max-connections 20000 --log error &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
base=$(rss)
"$herald" bench --kind fanout --url "ws://127.0.0.1:$port/ws" --clients "$clients" --topics 20000 \
  --subs "$subs" --publishers 1 --rate 10 --warmup 1 --duration 4 --set connect_rate=2000 \
  >/dev/null 2>&1 &
bench=$!
peak=$base conns=0
while kill -0 "$bench" 2>/dev/null; do
  r=$(rss)
  c=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '$1 == "herald_connections" { print $2 }')
  c=${c:-0}
  if [ "$c" -ge "$conns" ]; then conns=$c; peak=$r; fi
  sleep 0.5
done
[ "$conns" -gt 0 ] || { echo "no connection was ever open" >&2; exit 1; }
echo "clients=$clients subs=$subs connections=$conns base_kib=$base rss_kib=$peak kib_per_connection=$(( (peak - base) / conns ))"
