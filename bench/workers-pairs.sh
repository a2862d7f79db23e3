#!/usr/bin/env bash
# What a second worker thread costs herald: the Solace 3.1.2 scenario in interleaved rounds
# against herald with one worker thread on core 0, herald with two worker threads free to use
# both cores, and herald with two worker threads both on core 0; the bench on core 1 in all
# three. Prints each run's figures, medians over the rounds, and the ratios of each two-worker
# run to one worker of p99.9, p50 and herald's CPU per delivery. On two cores the second worker
# of `two-workers` shares its core with the bench; `two-workers-core0` keeps the core budget of
# one worker, so what it costs more is what two workers cost by themselves: the engine's lock
# taken from two threads, connections handed between them, more wake-ups.
#
#   bench/workers-pairs.sh [--clients N] [--duration SECS] [--warmup SECS] [--rounds R]
#                          [--bin HERALD] [--out DIR] [--scenario FILE] [--set KEY=VALUE]...
#
# Defaults: 1,000 clients, 20 s measured after 5 s of warm-up, 3 rounds, target/release/herald,
# reports in a new directory under /tmp (printed). herald's per-connection limit of 100,000
# frames/s is lifted, so the publisher is never cut off.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/rounds.sh"

while [ $# -gt 0 ]; do
    if round_option "$@"; then shift 2; continue; fi
    case "$1" in
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
prepare_rounds
server_pid=""

cleanup() {
    if [ -n "$server_pid" ]; then stop "$server_pid"; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf '[limits]\nmax_messages_per_sec = 0\nmax_bytes_per_sec = 0\n' >"$work/herald.toml"

# One round of herald with WORKERS threads on CORES: name, round, workers, cores.
serve_and_run() {
    local name="$1" round="$2" workers="$3" cores="$4" p
    p=$(port)
    taskset -c "$cores" "$bin" serve --listen "127.0.0.1:$p" --config "$work/herald.toml" \
        --workers "$workers" --log warn >"$work/$name.log" 2>&1 &
    server_pid=$!
    wait_listening "$p" || true
    run "$name" "$round" 1 --url "ws://127.0.0.1:$p/ws" --server-pid "$server_pid"
    stop "$server_pid"; server_pid=""
}

for round in $(seq "$rounds"); do
    serve_and_run one-worker "$round" 1 0
    serve_and_run two-workers "$round" 2 0,1
    serve_and_run two-workers-core0 "$round" 2 0
done

python3 "$here/pairs.py" --out "$out" --rounds "$rounds" \
    --title "Solace 3.1.2 scenario at $clients clients, one worker and two" two-workers one-worker
python3 "$here/pairs.py" --out "$out" --rounds "$rounds" \
    --title "Solace 3.1.2 scenario at $clients clients, one worker and two on its core" \
    two-workers-core0 one-worker
