#!/usr/bin/env bash
# Two herald builds in the same minutes: the Solace 3.1.2 scenario (as bench/reference-pairs.sh
# runs it) in interleaved rounds new, base, new, base, …; each server spawned on core 0 by the
# same bench (the new build's) on core 1. Prints each run's figures, the medians over the
# rounds, and the ratios new / base of p99.9, p50 and the server's CPU per delivery: the
# measure of a change whose effect is larger than what instruction counts show (cache misses,
# system calls).
#
#   bench/build-pairs.sh --base HERALD [--bin HERALD] [--clients N] [--duration SECS]
#                        [--warmup SECS] [--rounds R] [--out DIR] [--scenario FILE]
#                        [--set KEY=VALUE]...
#
# Defaults as bench/reference-pairs.sh's: 1,000 clients, 20 s after 5 s of warm-up, 3 rounds,
# target/release/herald as the new build; `--base` is required (e.g. a copy of the previous
# build's binary). herald's per-connection publish limits are lifted in every run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/rounds.sh"

base=""
while [ $# -gt 0 ]; do
    if round_option "$@"; then shift 2; continue; fi
    case "$1" in
        --base) base="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$base" ] || { echo "--base needs the herald binary to compare with" >&2; exit 2; }
prepare_rounds
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

printf '[limits]\nmax_messages_per_sec = 0\nmax_bytes_per_sec = 0\n' >"$work/herald.toml"
for round in $(seq "$rounds"); do
    for name in new base; do
        server="$bin"
        [ "$name" = new ] || server="$base"
        run "$name" "$round" "" --spawn-bin "$server" \
            --server-arg=--config --server-arg="$work/herald.toml"
    done
done

python3 "$here/pairs.py" --out "$out" --rounds "$rounds" \
    --title "Solace 3.1.2 scenario at $clients clients, two builds" new base
