#!/usr/bin/env bash
# Where herald's CPU goes beside the C reference server's, in the same minutes: the Solace 3.1.2
# scenario as bench/reference-pairs.sh runs it, in interleaved rounds herald, reference, …; each
# server started the same way (`taskset -c 0`, the bench on core 1 measuring it by pid), and
# `perf record` (2,999 Hz, call graphs) on it for SECONDS once the load is steady. Prints each
# run's samples by where they were taken (sending, reading, waiting, page faults, user space;
# bench/profile_buckets.py), the medians and the ratios herald / reference.
#
#   bench/profile-pairs.sh [--clients N] [--seconds S] [--warmup SECS] [--rounds R]
#                          [--bin HERALD] [--out DIR] [--scenario FILE] [--set KEY=VALUE]...
#
# Defaults: 1,000 clients, 4 s of samples after 5 s of warm-up, 3 rounds, target/release/herald,
# profiles (perf.data and its `perf script` text) and the bench's reports in a new directory
# under /tmp (printed). Needs `perf` and permission to profile another process (root, or
# kernel.perf_event_paranoid at most 1).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/rounds.sh"

seconds=4
while [ $# -gt 0 ]; do
    if round_option "$@"; then shift 2; continue; fi
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v perf >/dev/null || { echo "needs perf (Debian: linux-perf)" >&2; exit 1; }
prepare_rounds
make -s -C "$here/reference" epoll_fanout
server_pid="" bench_pid=""

cleanup() {
    if [ -n "$bench_pid" ]; then kill -INT "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true; fi
    if [ -n "$server_pid" ]; then stop "$server_pid"; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf '[limits]\nmax_messages_per_sec = 0\nmax_bytes_per_sec = 0\n' >"$work/herald.toml"
# The bench measures the samples' window and 4 s to spare (so `--duration` is not taken);
# connecting takes clients / 2,000 s (the scenario's rate), then the warm-up.
duration=$((seconds + 4))
settle=$(python3 -c "print(int($clients / 2000 + $warmup + 2))")

# One profiled run: name, round, the port the server listens on, then its command line.
profile() {
    local name="$1" round="$2" port="$3"; shift 3
    taskset -c 0 "$@" >"$work/$name.log" 2>&1 &
    server_pid=$!
    wait_listening "$port" || true
    run "$name" "$round" 1 --url "ws://127.0.0.1:$port/ws" --server-pid "$server_pid" &
    bench_pid=$!
    sleep "$settle"
    perf record -q -F 2999 -g -p "$server_pid" -o "$out/r$round-$name.perf.data" -- sleep "$seconds" >/dev/null 2>&1 \
        || echo "   perf failed in round $round ($name)" >&2
    wait "$bench_pid" || true
    bench_pid=""
    stop "$server_pid"; server_pid=""
    perf script -i "$out/r$round-$name.perf.data" -F ip,sym,dso 2>/dev/null >"$out/r$round-$name.perf.txt" || true
}

for round in $(seq "$rounds"); do
    port_herald=$(port)
    profile herald "$round" "$port_herald" \
        "$bin" serve --listen "127.0.0.1:$port_herald" --config "$work/herald.toml"
    port_reference=$(port)
    profile reference "$round" "$port_reference" "$here/reference/epoll_fanout" "$port_reference"
done

python3 "$here/pairs.py" --out "$out" --rounds "$rounds" \
    --title "Solace 3.1.2 scenario at $clients clients (profiled)" herald reference
python3 "$here/profile_buckets.py" --out "$out" --rounds "$rounds" herald reference
