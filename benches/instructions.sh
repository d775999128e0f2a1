#!/usr/bin/env bash
# Instructions per fenced PUT, counted by callgrind: fencegate, the fenced
# floor and the hyper floor (examples/hyper_floor.rs), each in front of the
# same nginx upstream, under the same load as the load bench's `put`
# scenario. Instruction counts do not move with what else the machine runs,
# so this is the figure to compare two builds by on a noisy machine.
#
#   benches/instructions.sh                     # ~3 min: builds, then each contender in turn
#   CONTENDERS=fencegate FENCEGATE_BIN=path/to/fencegate benches/instructions.sh
#
# Knobs (environment): CONTENDERS ("fencegate fenced-floor hyper-floor"),
# SECONDS_MEASURED (10), CONNS (64), KEYS (10000), ACCESS_LOG (on; "off"
# leaves fencegate's and the fenced floor's access lines out), FENCEGATE_BIN
# and HYPER_FLOOR_BIN (use these binaries, skip `cargo build`), OUT (a
# directory for the callgrind files and logs; a temp dir otherwise).
#
# Every key is given its mark before counting (a first mark costs a new
# entry), then the counters are zeroed, wrk runs SECONDS_MEASURED seconds
# and the count since the zero is divided by the requests wrk saw answered.
# Under callgrind the proxy runs ~50x slower, so a run answers a few
# thousand requests: counts move by about ±300 instructions per request
# from run to run with how many requests each wake of a task carries. Read
# a difference smaller than that as none. Needs valgrind, nginx, wrk, curl.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
CONTENDERS=${CONTENDERS:-"fencegate fenced-floor hyper-floor"}
SECONDS_MEASURED=${SECONDS_MEASURED:-10}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
ACCESS_LOG=${ACCESS_LOG:-on}

die() { echo "instructions.sh: $*" >&2; exit 1; }
for tool in valgrind callgrind_control nginx wrk curl; do
    command -v "$tool" >/dev/null || die "needs $tool (Debian: valgrind, nginx, wrk, curl)"
done
[[ "$ACCESS_LOG" == on || "$ACCESS_LOG" == off ]] || die "ACCESS_LOG must be on or off, got '$ACCESS_LOG'"

if [[ -z "${FENCEGATE_BIN:-}" || -z "${HYPER_FLOOR_BIN:-}" ]]; then
    (cd "$repo" && cargo build --release --locked --bin fencegate --example hyper_floor >&2) || die "cargo build failed"
    target_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
fi
FENCEGATE_BIN=${FENCEGATE_BIN:-$target_dir/release/fencegate}
HYPER_FLOOR_BIN=${HYPER_FLOOR_BIN:-$target_dir/release/examples/hyper_floor}

OUT=${OUT:-$(mktemp -d -t fencegate-instructions-XXXXXX)}
mkdir -p "$OUT"
PIDS=()
NGINX_PID=
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    # nginx's master takes its worker with it only on a signal it handles.
    if [[ -n "$NGINX_PID" ]]; then
        kill -TERM "$NGINX_PID" 2>/dev/null || true
        wait "$NGINX_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_up() { # url
    for _ in $(seq 300); do
        curl -s -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.2
    done
    return 1
}

# The upstream: the load bench's nginx, one worker, 200 "ok" to everything.
up_port=$(free_port)
user_line="# (not root)"
[[ "$(id -u)" == 0 ]] && user_line="user root;"
mkdir -p "$OUT/upstream"
sed -e "s|@USER_LINE@|$user_line|" -e "s|@DIR@|$OUT/upstream|g" -e "s|@PORT@|$up_port|" \
    "$here/load/upstream-nginx.conf.in" >"$OUT/upstream/nginx.conf"
nginx -p "$OUT/upstream/" -c "$OUT/upstream/nginx.conf" -e "$OUT/upstream/error.log" >"$OUT/upstream/stdout.log" 2>&1 &
NGINX_PID=$!
wait_up "http://127.0.0.1:$up_port/" || die "the upstream nginx did not start (see $OUT/upstream)"

level=warn
[[ "$ACCESS_LOG" == on ]] && level=info
declare -A PER_REQUEST=()

for contender in $CONTENDERS; do
    port=$(free_port)
    d=$OUT/$contender
    mkdir -p "$d"
    case $contender in
        fencegate)
            cat >"$d/fencegate.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
workers = 2
[admin]
listen = "127.0.0.1:$(free_port)"
[fences]
store = "memory"
[log]
level = "$level"
[[route]]
name = "objects"
prefix = "/objects/"
upstream = "http://127.0.0.1:$up_port"
key = "{path}"
EOF
            cmd=("$FENCEGATE_BIN" --config "$d/fencegate.toml")
            ;;
        fenced-floor) cmd=("$HYPER_FLOOR_BIN" "127.0.0.1:$port" "127.0.0.1:$up_port" 2 fence) ;;
        hyper-floor) cmd=("$HYPER_FLOOR_BIN" "127.0.0.1:$port" "127.0.0.1:$up_port" 2) ;;
        *) die "unknown contender '$contender' (fencegate, fenced-floor, hyper-floor)" ;;
    esac
    # RUST_LOG: the fenced floor's log level (fencegate's config says the same).
    RUST_LOG=$level valgrind --tool=callgrind --callgrind-out-file="$d/callgrind.out" "${cmd[@]}" \
        >"$d/stdout.log" 2>"$d/stderr.log" &
    pid=$!
    PIDS+=("$pid")
    url="http://127.0.0.1:$port/objects/put/"
    wait_up "http://127.0.0.1:$port/" || die "$contender did not start (see $d)"
    # Every key gets its mark first: the load bench primes its keys too.
    wrk -t1 -c"$CONNS" -d300s -s "$here/load/keys.lua" "$url" -- PUT "$KEYS" 7 prime "$CONNS" >"$d/prime.wrk" 2>&1 ||
        die "$contender: priming failed (see $d/prime.wrk)"
    callgrind_control -z "$pid" >/dev/null 2>&1
    wrk -t1 -c"$CONNS" -d"${SECONDS_MEASURED}s" -s "$here/load/keys.lua" "$url" -- PUT "$KEYS" 7 >"$d/measured.wrk" 2>&1 ||
        die "$contender: wrk failed (see $d/measured.wrk)"
    callgrind_control -d "$pid" >/dev/null 2>&1
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    result=$(grep -o 'WRK_RESULT.*' "$d/measured.wrk") || die "$contender: no result line (see $d/measured.wrk)"
    requests=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$result")
    bad=$(sed -n 's/.* status=\([0-9]*\).*/\1/p' <<<"$result")
    [[ "$bad" == 0 ]] || die "$contender: $bad answers over 399 (see $d)"
    dump=$(ls -t "$d"/callgrind.out.* | head -1)
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    PER_REQUEST[$contender]=$((total / requests))
    echo "$contender: $requests requests, ${PER_REQUEST[$contender]} instructions per request ($dump)" >&2
done

echo
echo "| contender | instructions per fenced PUT | ×hyper-floor |"
echo "|---|---:|---:|"
for contender in $CONTENDERS; do
    ratio=""
    if [[ -n "${PER_REQUEST[hyper-floor]:-}" ]]; then
        ratio=$(awk -v a="${PER_REQUEST[$contender]}" -v b="${PER_REQUEST[hyper-floor]}" 'BEGIN {printf "×%.2f", a / b}')
    fi
    echo "| $contender | ${PER_REQUEST[$contender]} | $ratio |"
done
echo
echo "access log: $ACCESS_LOG; $CONNS connections, $KEYS keys primed, ${SECONDS_MEASURED}s counted; files in $OUT"
