#!/usr/bin/env bash
# herald's MQTT path beside its native path and beside Mosquitto 2.0, in the same minutes:
# the Solace 3.1.2 scenario (20,000 topics, 20,000 msg/s, 100 subscriptions
# and 100 msg/s per client, 50-byte payloads) in interleaved rounds herald-native, herald-mqtt,
# mosquitto; every server on core 0, the bench on core 1. Prints each run's figures, the
# medians over the rounds, and the ratios herald-mqtt / herald-native and herald-mqtt /
# mosquitto of p99.9 and of the server's CPU per delivery.
#
#   bench/mqtt-vs-mosquitto.sh [--clients N] [--duration SECS] [--warmup SECS] [--rounds R]
#                              [--qos 0|1] [--bin HERALD] [--mosquitto PATH] [--out DIR]
#                              [--scenario FILE] [--set KEY=VALUE]...
#
# Defaults: 1,000 clients, 30 s measured after 5 s of warm-up, 3 rounds, QoS 0,
# target/release/herald, /usr/sbin/mosquitto, reports (JSON and Markdown per run) in a new
# directory under /tmp (printed).
#
# - herald-native: herald's own protocol on /ws, spawned by the bench (`--spawn-bin`, which
#   pins herald to core 0 and the bench to core 1).
# - herald-mqtt: the same server, publisher and subscribers speaking MQTT 3.1.1 over WebSocket
#   (`/mqtt`, subprotocol `mqtt`).
# - mosquitto: a fresh Mosquitto each round (`taskset -c 0`), the bench on core 1 with
#   `--server-pid` for Mosquitto's CPU; MQTT over WebSocket as above.
# No run asks herald for its receive stamp (MQTT has no way to), so the three do the same work
# and are timed the same way: receive − send, from the send time in each payload.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/rounds.sh"

duration=30 qos=0
mosquitto=/usr/sbin/mosquitto
while [ $# -gt 0 ]; do
    if round_option "$@"; then shift 2; continue; fi
    case "$1" in
        --qos) qos="$2"; shift 2 ;;
        --mosquitto) mosquitto="$2"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$mosquitto" ] || { echo "no mosquitto at $mosquitto (apt-get install mosquitto, or --mosquitto)" >&2; exit 1; }
prepare_rounds
mq_pid=""
extra+=(--set stamp=false --set mqtt_qos="$qos")

cleanup() {
    if [ -n "$mq_pid" ]; then stop "$mq_pid"; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts Mosquitto on a fresh configuration; sets mq_pid and mq_ws (its WebSocket port).
start_mosquitto() {
    local tcp
    mq_ws=$(port); tcp=$(port)
    cat > "$work/mosquitto.conf" <<EOF
# Written by bench/mqtt-vs-mosquitto.sh for one round.
per_listener_settings false
allow_anonymous true
persistence false
# QoS 0 fan-out: what a subscriber's socket cannot take yet waits in Mosquitto's queue; room
# enough that it never drops for want of it. QoS 1: as many unacknowledged messages per
# subscriber as herald allows a 3.1.1 client (its receive maximum, 65,535).
max_queued_messages 1000000
max_queued_bytes 0
max_inflight_messages 65535
set_tcp_nodelay true
connection_messages false
log_dest file $work/mosquitto.log
log_type error
log_type warning
user $(id -un)
# Debian's 2.0.11 does not start with a websockets listener alone; this one stays unused.
listener $tcp 127.0.0.1
listener $mq_ws 127.0.0.1
protocol websockets
EOF
    taskset -c 0 "$mosquitto" -c "$work/mosquitto.conf" >>"$work/mosquitto.log" 2>&1 &
    mq_pid=$!
    for _ in $(seq 100); do
        if ! kill -0 "$mq_pid" 2>/dev/null; then
            echo "mosquitto exited at start (no websockets support?); its log:" >&2
            cat "$work/mosquitto.log" >&2 || true
            mq_pid=""
            exit 1
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$mq_ws") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "mosquitto did not open its websockets listener within 10 s" >&2
    exit 1
}

for round in $(seq "$rounds"); do
    run herald-native "$round" "" --spawn-bin "$bin"
    run herald-mqtt "$round" "" --spawn-bin "$bin" --set protocol=mqtt
    start_mosquitto
    run mosquitto "$round" 1 --url "ws://127.0.0.1:$mq_ws/mqtt" --server-pid "$mq_pid" \
        --set protocol=mqtt
    stop "$mq_pid"; mq_pid=""
done

python3 "$here/pairs.py" --out "$out" --rounds "$rounds" --title "Solace 3.1.2 scenario" \
    herald-mqtt herald-native mosquitto
