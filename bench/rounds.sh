# Shared by the interleaved-round scripts (bench/build-pairs.sh, bench/mqtt-vs-mosquitto.sh,
# bench/profile-pairs.sh, bench/reference-pairs.sh, bench/workers-pairs.sh): sourced, not run,
# after the script sets `here` to bench/. Their shared options and defaults, the checks before
# the rounds, and `run`, which passes `extra` (more `--set`s) to every bench run.

clients=1000 duration=20 warmup=5 rounds=3
bin="$here/../target/release/herald"
scenario="$here/scenarios/solace-3.1.2-very-high.toml"
out=""
extra=()

# Takes one of the shared options, "$1" with its value "$2"; fails for any other.
round_option() {
    case "$1" in
        --clients) clients="$2" ;;
        --duration) duration="$2" ;;
        --warmup) warmup="$2" ;;
        --rounds) rounds="$2" ;;
        --bin) bin="$2" ;;
        --out) out="$2" ;;
        --scenario) scenario="$2" ;;
        --set) extra+=(--set "$2") ;;
        *) return 1 ;;
    esac
}

# After the options: the herald binary and two cores are there; `out` (a new directory under
# /tmp named after the script, unless given) and `work` (scratch) exist.
prepare_rounds() {
    [ -x "$bin" ] || { echo "no herald binary at $bin (cargo build --release -p herald, or --bin)" >&2; exit 1; }
    [ "$(nproc)" -ge 2 ] || { echo "needs two cores: the server on core 0, the bench on core 1" >&2; exit 1; }
    [ -n "$out" ] || out=$(mktemp -d "/tmp/$(basename "$0" .sh).XXXXXX")
    mkdir -p "$out"
    work=$(mktemp -d)
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for something to listen on 127.0.0.1:PORT (a server this script started).
wait_listening() {
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "   nothing listens on port $1 after 10 s" >&2
    return 1
}

# Stops a process this script started: TERM, then KILL after 5 s.
stop() {
    local pid="$1"
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# One run: name, round, the core the bench is pinned to ("" when it pins itself beside a
# server it spawns), then its target arguments. Bounded: connecting at the scenario's
# 2,000/s, warm-up, window, drain, and a minute and a half to spare; SIGINT first, which the
# bench answers by stopping what it spawned.
run() {
    local name="$1" round="$2" core="$3"; shift 3
    local limit pin=()
    limit=$(python3 -c "print(int($clients / 2000 + $warmup + $duration + 90))")
    [ -z "$core" ] || pin=(taskset -c "$core")
    echo "== round $round/$rounds: $name ($clients clients, ${duration}s)" >&2
    timeout -s INT -k 20 "$limit" "${pin[@]}" "$bin" bench "$scenario" "$@" \
        --clients "$clients" --duration "$duration" --set warmup="$warmup" \
        "${extra[@]}" --quiet \
        --json "$out/r$round-$name.json" --markdown "$out/r$round-$name.md" >/dev/null \
        || echo "   $name failed in round $round (exit $?); see $out/r$round-$name.md if written" >&2
}

