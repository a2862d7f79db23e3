#!/usr/bin/env bash
# herald beside the C reference server (bench/reference/epoll_fanout.c) in the same minutes:
# the Solace 3.1.2 scenario (20,000 topics, 100 subscriptions and 100 msg/s per client, 50-byte
# payloads) in interleaved rounds herald, reference, herald, reference, …; every server on
# core 0, the bench on core 1. Prints each run's figures, the medians over the rounds, and the
# ratios herald / reference of p99.9, p50 and the server's CPU per delivery.
#
#   bench/reference-pairs.sh [--clients N] [--duration SECS] [--warmup SECS] [--rounds R]
#                            [--bin HERALD] [--out DIR] [--scenario FILE] [--set KEY=VALUE]...
#                            [--herald-config FILE]
#
# Defaults: 1,000 clients, 20 s measured after 5 s of warm-up, 3 rounds, target/release/herald,
# reports (JSON and Markdown per run) in a new directory under /tmp (printed). `--set` passes a
# scenario key to both (e.g. `--set rate=160000` for 800 k/s at 1,000 clients; herald's
# per-connection limit of 100,000 frames/s is lifted for every run, so the publisher is never
# cut off). `--herald-config` adds FILE's settings to herald's configuration, e.g. a
# `[[history]]` rule with `pattern = ">"` and `max_messages = 0` to keep last values only, the
# work the reference does.
# herald is spawned by the bench (`--spawn-bin`, which pins it to core 0 and the bench to
# core 1); the reference runs under `taskset -c 0`, measured with `--server-pid`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/rounds.sh"

herald_config=""
while [ $# -gt 0 ]; do
    if round_option "$@"; then shift 2; continue; fi
    case "$1" in
        --herald-config) herald_config="$2"; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -n "$herald_config" ] && [ ! -r "$herald_config" ]; then
    echo "cannot read --herald-config $herald_config" >&2; exit 2
fi
prepare_rounds
make -s -C "$here/reference" epoll_fanout
ref_pid=""

cleanup() {
    if [ -n "$ref_pid" ]; then stop "$ref_pid"; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf '[limits]\nmax_messages_per_sec = 0\nmax_bytes_per_sec = 0\n' >"$work/herald.toml"
if [ -n "$herald_config" ]; then cat "$herald_config" >>"$work/herald.toml"; fi

for round in $(seq "$rounds"); do
    run herald "$round" "" --spawn-bin "$bin" --server-arg=--config --server-arg="$work/herald.toml"
    ref_port=$(port)
    taskset -c 0 "$here/reference/epoll_fanout" "$ref_port" >"$work/reference.log" 2>&1 &
    ref_pid=$!
    wait_listening "$ref_port" || true
    run reference "$round" 1 --url "ws://127.0.0.1:$ref_port/ws" --server-pid "$ref_pid"
    stop "$ref_pid"; ref_pid=""
done

python3 "$here/pairs.py" --out "$out" --rounds "$rounds" \
    --title "Solace 3.1.2 scenario at $clients clients" herald reference
