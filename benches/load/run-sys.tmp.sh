#!/usr/bin/env bash
# End-to-end load benchmark: fencegate against nginx and HAProxy as plain
# reverse proxies, all in front of the same nginx upstream, driven by wrk.
#
#   benches/load/run.sh                      # from anywhere; ~8 min with defaults
#   ROUNDS=1 SECONDS=2 WARMUP=1 benches/load/run.sh   # quick check (~1.5 min)
#
# Knobs (environment): ROUNDS (3), SECONDS (5; DURATION is an alias), WARMUP (1),
# CONNS (64), KEYS (10000), ACCESS_LOG (off; "on": fencegate's access log at
# info to its stdout file, nginx's to a file with a 64k buffer, as deployed),
# SCENARIOS ("put get hotkey raise churn"), CONTENDERS (all;
# e.g. "nginx fencegate-memory"), OUT (a directory for
# results.csv, report.txt and the wrk/server logs), FENCEGATE_BIN (use this
# binary, skip `cargo build`), HYPER_FLOOR_BIN (the same for the hyper-floor and fenced-floor
# contenders, examples/hyper_floor.rs), SETTLE_WAIT_MS (2500: pause between two runs on
# the same fencing fencegate and keys, see README). See benches/load/README.md.
#
# Exit status: 0 ok; 1 setup failure (a tool missing, a contender that did not
# start, wrk failing); 3 the run finished but some requests failed (non-2xx or
# socket errors: see the errors column; those rows are not valid).

# Bash's SECONDS counts seconds since the shell started, starting from the value
# it inherited: read it before anything else takes time.
inherited_seconds=$SECONDS

set -euo pipefail

# ---------------------------------------------------------------- settings ---

export LC_ALL=C
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

if [[ -n "${DURATION:-}" ]]; then
    ROUND_SECONDS=$DURATION
elif [[ "$inherited_seconds" -gt 0 ]]; then
    ROUND_SECONDS=$inherited_seconds
else
    ROUND_SECONDS=5
fi
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
SCENARIOS=${SCENARIOS:-put get hotkey raise churn}
ACCESS_LOG=${ACCESS_LOG:-off}
CONTENDERS=${CONTENDERS:-}
OUT=${OUT:-}

die() { echo "run.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }

for v in ROUND_SECONDS ROUNDS WARMUP CONNS KEYS; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
((ROUND_SECONDS > 0)) || die "SECONDS must be at least 1"
((ROUNDS > 0)) || die "ROUNDS must be at least 1"
((CONNS > 0)) || die "CONNS must be at least 1"
((KEYS > 0)) || die "KEYS must be at least 1"
[[ "$ACCESS_LOG" == on || "$ACCESS_LOG" == off ]] || die "ACCESS_LOG must be on or off, got '$ACCESS_LOG'"

ALL_SCENARIOS="put get hotkey raise churn"
ALL_CONTENDERS="nginx nginx-lua haproxy hyper-floor fenced-floor fencegate-memory fencegate-file fencegate-unfenced upstream"
for s in $SCENARIOS; do
    [[ " $ALL_SCENARIOS " == *" $s "* ]] || die "unknown scenario '$s' (known: $ALL_SCENARIOS)"
done
for c in $CONTENDERS; do
    [[ " $ALL_CONTENDERS " == *" $c "* ]] || die "unknown contender '$c' (known: $ALL_CONTENDERS)"
done

# Who runs in which scenario, in table order. The first one is the reference of
# the ratio columns.
declare -A LINEUP=(
    [put]="nginx nginx-lua haproxy hyper-floor fenced-floor fencegate-memory fencegate-file fencegate-unfenced upstream"
    [get]="nginx haproxy hyper-floor fencegate-memory upstream"
    [hotkey]="nginx nginx-lua fencegate-memory"
    [raise]="fencegate-memory fencegate-file"
    [churn]="nginx haproxy hyper-floor fencegate-memory"
)
declare -A REFERENCE=([put]=nginx [get]=nginx [hotkey]=nginx [raise]=fencegate-memory [churn]=nginx)
declare -A TITLE=(
    [put]="fenced PUT, constant token (equal to the mark: no store write), $KEYS keys"
    [get]="GET pass-through, $KEYS keys"
    [hotkey]="fenced PUT, constant token, all to ONE key"
    [raise]="fenced PUT, every request raises its key's token, $KEYS keys"
    [churn]="fenced PUT, constant token, one key, a new connection per request (Connection: close)"
)
# URL path per scenario: disjoint keys, so one scenario's marks never meet another's.
declare -A URLPATH=([put]=/objects/put/ [get]=/objects/get/ [hotkey]=/objects/hot/k0 [raise]=/objects/raise/ [churn]=/objects/churn/k0)

lineup() { # scenario -> its contenders after the CONTENDERS filter
    local c out=()
    for c in ${LINEUP[$1]}; do
        if [[ -z "$CONTENDERS" || " $CONTENDERS " == *" $c "* ]]; then out+=("$c"); fi
    done
    echo "${out[*]-}"
}

# ------------------------------------------------------------------- tools ---

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

missing=()
for t in nginx haproxy wrk; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
if ((${#missing[@]})); then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "missing: ${missing[*]}; installing nginx haproxy wrk"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y nginx haproxy wrk >&2 || { apt-get update >&2 && apt-get install -y nginx haproxy wrk >&2; } ||
            die "could not install nginx haproxy wrk"
    else
        log "run.sh: missing: ${missing[*]}"
        log "install them first, e.g. (Debian/Ubuntu): sudo apt-get install -y nginx haproxy wrk"
        exit 1
    fi
fi
for t in curl awk getconf; do
    command -v "$t" >/dev/null 2>&1 || die "missing '$t'; install it first"
done

target_dir=${CARGO_TARGET_DIR:-target}
[[ "$target_dir" == /* ]] || target_dir=$repo/$target_dir
if [[ -n "${FENCEGATE_BIN:-}" ]]; then
    BIN=$FENCEGATE_BIN
    [[ -x "$BIN" ]] || die "FENCEGATE_BIN='$BIN' is not an executable file"
    BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
    BIN_ORIGIN="FENCEGATE_BIN"
else
    command -v cargo >/dev/null 2>&1 || die "cargo not found (or set FENCEGATE_BIN to a fencegate binary)"
    log "building fencegate: cargo build --release --locked"
    (cd "$repo" && cargo build --release --locked >&2) || die "cargo build failed"
    BIN=$target_dir/release/fencegate
    [[ -x "$BIN" ]] || die "no binary at $BIN after the build"
    BIN_ORIGIN="built by this script"
fi
# The hyper floor (examples/hyper_floor.rs): hyper alone, the leanest way.
if [[ -n "${HYPER_FLOOR_BIN:-}" ]]; then
    FLOOR_BIN=$HYPER_FLOOR_BIN
    [[ -x "$FLOOR_BIN" ]] || die "HYPER_FLOOR_BIN='$FLOOR_BIN' is not an executable file"
elif [[ " $(for s in $SCENARIOS; do lineup "$s"; done | tr '\n' ' ') " =~ " "(hyper|fenced)-floor" " ]]; then
    command -v cargo >/dev/null 2>&1 || die "cargo not found (or set HYPER_FLOOR_BIN, or leave out the hyper-floor contender)"
    log "building the hyper floor: cargo build --release --locked --example hyper_floor"
    (cd "$repo" && cargo build --release --locked --example hyper_floor >&2) || die "cargo build --example hyper_floor failed"
    FLOOR_BIN=$target_dir/release/examples/hyper_floor
    [[ -x "$FLOOR_BIN" ]] || die "no binary at $FLOOR_BIN after the build"
fi

CLK_TCK=$(getconf CLK_TCK)

# ------------------------------------------------- temp dir and processes ---

work=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-load.XXXXXX")
declare -a STARTED=()     # root pids of everything we started
declare -A PID=()         # process name -> root pid

children_of() { # pid -> pids of its direct children
    local f line rest state ppid
    for f in /proc/[0-9]*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        rest=${line##*) }
        read -r state ppid _ <<<"$rest"
        if [[ "$ppid" == "$1" ]]; then
            line=${f#/proc/}
            echo "${line%/stat}"
        fi
    done
}

stop_all() {
    local pid victims=() i
    for pid in "${STARTED[@]}"; do
        kill -0 "$pid" 2>/dev/null || continue
        victims+=("$pid")
        # nginx workers: remembered now, in case the master dies first.
        mapfile -t -O "${#victims[@]}" victims < <(children_of "$pid")
    done
    ((${#victims[@]})) || return 0
    for pid in "${STARTED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 30; i++)); do
        local alive=0
        for pid in "${victims[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${victims[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "${STARTED[@]}"; do { wait "$pid"; } 2>/dev/null || true; done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all || true
    rm -rf "$work" || true
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'exit 143' TERM

# Free ports: below the kernel's ephemeral range (so no outgoing connection can
# hold them later) and not bound by any TCP socket now.
read -r eph_low _ </proc/sys/net/ipv4/ip_local_port_range
if ((eph_low > 12000)); then port_lo=10000 port_hi=$((eph_low - 1)); else port_lo=61000 port_hi=65000; fi
used_ports=" "
while read -r _ local_addr _; do
    [[ "$local_addr" == *:* ]] || continue # the header line
    used_ports+="$((16#${local_addr##*:})) "
done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null || true)
pick_port() {
    local p tries
    for ((tries = 0; tries < 1000; tries++)); do
        p=$((port_lo + (RANDOM * 32768 + RANDOM) % (port_hi - port_lo + 1)))
        if [[ "$used_ports" != *" $p "* ]]; then
            used_ports+="$p "
            echo "$p"
            return 0
        fi
    done
    die "no free port found in $port_lo-$port_hi"
}

nginx_access_log() { # dir : the access_log directive for a proxy contender
    if [[ "$ACCESS_LOG" == on ]]; then
        echo "access_log $1/access.log combined buffer=64k flush=1s;"
    else
        echo "access_log off;"
    fi
}

render() { # template output NAME=value... : replaces @NAME@ with value
    local tmpl=$1 out=$2
    shift 2
    awk -v n="$#" '
        BEGIN {
            for (i = 1; i <= n; i++) {
                kv = ARGV[i]; ARGV[i] = ""
                eq = index(kv, "=")
                key[i] = "@" substr(kv, 1, eq - 1) "@"; val[i] = substr(kv, eq + 1)
            }
        }
        {
            line = $0
            for (i = 1; i <= n; i++) {
                res = ""
                while ((p = index(line, key[i])) > 0) {
                    res = res substr(line, 1, p - 1) val[i]
                    line = substr(line, p + length(key[i]))
                }
                line = res line
            }
            print line
        }' "$@" <"$tmpl" >"$out"
    if grep -q '@[A-Z_]*@' "$out"; then die "unfilled placeholder in $out"; fi
}

start_proc() { # name logfile command...
    local name=$1 logf=$2
    shift 2
    "$@" </dev/null >"$logf" 2>&1 &
    PID[$name]=$!
    STARTED+=("$!")
}

fail_start() { # name message: print the tail of every log of that process, exit 1
    local f
    log "run.sh: $1 $2"
    for f in "$work/$1"/*.log; do
        [[ -s "$f" ]] || continue
        log "--- last lines of $f:"
        tail -n 40 "$f" >&2 || true
    done
    exit 1
}

wait_ready() { # name url...
    local name=$1 i url ok
    shift
    for ((i = 0; i < 150; i++)); do
        kill -0 "${PID[$name]}" 2>/dev/null || fail_start "$name" "exited during start-up"
        ok=1
        for url in "$@"; do
            curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null || { ok=0; break; }
        done
        ((ok)) && return 0
        sleep 0.1
    done
    fail_start "$name" "not ready after 15 s ($*)"
}

procs_of() { # contender -> its pids (root and child processes)
    local root=${PID[$(proc_name "$1")]}
    echo "$root"
    children_of "$root"
}

proc_name() { # contender -> the process serving it
    case $1 in upstream) echo upstream-nginx ;; *) echo "$1" ;; esac
}

cpu_ticks() { # pids... -> utime + stime, clock ticks, summed
    local pid line rest total=0 f
    for pid in "$@"; do
        { read -r line <"/proc/$pid/stat"; } 2>/dev/null || continue
        rest=${line##*) }
        read -r -a f <<<"$rest"
        # after "pid (comm) ": state=0 ppid=1 ... utime=11 stime=12
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

thread_ticks() {
    local pid t line rest f
    for pid in "$@"; do
        for t in /proc/$pid/task/*; do
            { read -r line <"$t/stat"; } 2>/dev/null || continue
            rest=${line##*) }
            read -r -a f <<<"$rest"
            local comm=${line#*(}; comm=${comm%%)*}
            echo "${t##*/} ${comm// /_} ${f[11]} ${f[12]}"
        done
    done | sort
}

sys_ticks() {
    local pid line rest total=0 f
    for pid in "$@"; do
        { read -r line <"/proc/$pid/stat"; } 2>/dev/null || continue
        rest=${line##*) }
        read -r -a f <<<"$rest"
        total=$((total + f[12]))
    done
    echo "$total"
}

peak_rss_kib() { # pids... -> VmHWM summed, KiB
    local pid total=0 k v _
    for pid in "$@"; do
        while read -r k v _; do
            [[ "$k" == VmHWM: ]] && total=$((total + v))
        done <"/proc/$pid/status" 2>/dev/null || true
    done
    echo "$total"
}

now_ms() { date +%s%3N; }

fg_counters() { # contender -> "settles raises commits" from fencegate's /metrics ("0 0 0" for others)
    if [[ "$1" != fencegate-* ]]; then
        echo "0 0 0"
        return 0
    fi
    curl -fsS --max-time 5 "http://127.0.0.1:${ADMIN_PORT[$1]}/metrics" 2>/dev/null | awk '
        /^fencegate_settles_total[{ ]/ { s += $NF }
        /^fencegate_store_raises_total / { r = $NF }
        /^fencegate_store_commits_total / { c = $NF }
        END { printf "%d %d %d\n", s, r, c }' || echo "0 0 0"
}

# Which processes this run needs.
declare -A NEEDED=()
for s in $SCENARIOS; do
    for c in $(lineup "$s"); do NEEDED[$(proc_name "$c")]=1; done
done
((${#NEEDED[@]})) || die "nothing to run: no contender of SCENARIOS='$SCENARIOS' passes CONTENDERS='$CONTENDERS'"

USER_LINE="# (not root: workers run as this user)"
[[ "$(id -u)" == 0 ]] && USER_LINE="user root;  # root: keep workers able to use the 0700 temp dir"
KEEPALIVE=$((CONNS > 128 ? CONNS : 128))

declare -A PORT=() ADMIN_PORT=()
PORT[upstream-nginx]=$(pick_port)

# --- the upstream
d=$work/upstream-nginx
mkdir -p "$d"
render "$here/upstream-nginx.conf.in" "$d/nginx.conf" DIR="$d" PORT="${PORT[upstream-nginx]}" USER_LINE="$USER_LINE"
nginx -t -q -p "$d/" -c "$d/nginx.conf" -e "$d/error.log" >"$d/check.log" 2>&1 || { cat "$d/check.log" >&2; die "upstream nginx config rejected"; }
start_proc upstream-nginx "$d/stdout.log" nginx -p "$d/" -c "$d/nginx.conf" -e "$d/error.log"
wait_ready upstream-nginx "http://127.0.0.1:${PORT[upstream-nginx]}/"
UP=${PORT[upstream-nginx]}

# --- nginx as a reverse proxy
if [[ -n "${NEEDED[nginx]:-}" ]]; then
    PORT[nginx]=$(pick_port)
    d=$work/nginx
    mkdir -p "$d"
    render "$here/proxy-nginx.conf.in" "$d/nginx.conf" DIR="$d" PORT="${PORT[nginx]}" UPSTREAM_PORT="$UP" \
        KEEPALIVE="$KEEPALIVE" USER_LINE="$USER_LINE" ACCESS_LOG_LINE="$(nginx_access_log "$d")"
    nginx -t -q -p "$d/" -c "$d/nginx.conf" -e "$d/error.log" >"$d/check.log" 2>&1 || { cat "$d/check.log" >&2; die "nginx proxy config rejected"; }
    start_proc nginx "$d/stdout.log" nginx -p "$d/" -c "$d/nginx.conf" -e "$d/error.log"
    wait_ready nginx "http://127.0.0.1:${PORT[nginx]}/"
fi

# --- nginx with a fence check in Lua
if [[ -n "${NEEDED[nginx-lua]:-}" ]]; then
    [[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]] || {
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "missing nginx's Lua module; installing libnginx-mod-http-lua"
            DEBIAN_FRONTEND=noninteractive apt-get install -y libnginx-mod-http-lua >&2 ||
                die "could not install libnginx-mod-http-lua"
        else
            die "the nginx-lua contender needs libnginx-mod-http-lua (or leave it out with CONTENDERS)"
        fi
    }
    PORT[nginx-lua]=$(pick_port)
    d=$work/nginx-lua
    mkdir -p "$d"
    render "$here/proxy-nginx-lua.conf.in" "$d/nginx.conf" DIR="$d" PORT="${PORT[nginx-lua]}" UPSTREAM_PORT="$UP" \
        KEEPALIVE="$KEEPALIVE" USER_LINE="$USER_LINE" ACCESS_LOG_LINE="$(nginx_access_log "$d")"
    nginx -t -q -p "$d/" -c "$d/nginx.conf" -e "$d/error.log" >"$d/check.log" 2>&1 || { cat "$d/check.log" >&2; die "nginx-lua config rejected"; }
    start_proc nginx-lua "$d/stdout.log" nginx -p "$d/" -c "$d/nginx.conf" -e "$d/error.log"
    wait_ready nginx-lua "http://127.0.0.1:${PORT[nginx-lua]}/"
fi

# --- HAProxy
if [[ -n "${NEEDED[haproxy]:-}" ]]; then
    PORT[haproxy]=$(pick_port)
    d=$work/haproxy
    mkdir -p "$d"
    render "$here/haproxy.cfg.in" "$d/haproxy.cfg" PORT="${PORT[haproxy]}" UPSTREAM_PORT="$UP"
    haproxy -c -q -f "$d/haproxy.cfg" >"$d/check.log" 2>&1 || { cat "$d/check.log" >&2; die "haproxy config rejected"; }
    # -db: stay in the foreground (no daemon), so we own the process.
    start_proc haproxy "$d/haproxy.log" haproxy -db -f "$d/haproxy.cfg"
    wait_ready haproxy "http://127.0.0.1:${PORT[haproxy]}/"
fi

# --- the hyper floor: two worker threads, the same CPU budget as the others
if [[ -n "${NEEDED[hyper-floor]:-}" ]]; then
    PORT[hyper-floor]=$(pick_port)
    mkdir -p "$work/hyper-floor"
    start_proc hyper-floor "$work/hyper-floor/hyper-floor.log" "$FLOOR_BIN" "127.0.0.1:${PORT[hyper-floor]}" "127.0.0.1:$UP" 2
    wait_ready hyper-floor "http://127.0.0.1:${PORT[hyper-floor]}/"
fi
# --- the same with the least a fencing proxy does (see examples/hyper_floor.rs),
# its access log at info to its stdout file with ACCESS_LOG=on, as fencegate's
if [[ -n "${NEEDED[fenced-floor]:-}" ]]; then
    PORT[fenced-floor]=$(pick_port)
    mkdir -p "$work/fenced-floor"
    floor_level=warn
    [[ "$ACCESS_LOG" == on ]] && floor_level=info
    start_proc fenced-floor "$work/fenced-floor/fenced-floor.log" env RUST_LOG=$floor_level \
        "$FLOOR_BIN" "127.0.0.1:${PORT[fenced-floor]}" "127.0.0.1:$UP" 2 fence
    wait_ready fenced-floor "http://127.0.0.1:${PORT[fenced-floor]}/"
fi

# --- fencegate: one process per store, plus one whose route fences nothing
start_fencegate() { # name fences-lines safe-methods allow-safe-body
    local name=$1 d=$work/$1
    mkdir -p "$d"
    PORT[$name]=$(pick_port)
    ADMIN_PORT[$name]=$(pick_port)
    # workers = 2: two serving threads, the same CPU budget as the other proxies.
    render "$here/fencegate.toml.in" "$d/fencegate.toml" PORT="${PORT[$name]}" ADMIN_PORT="${ADMIN_PORT[$name]}" \
        UPSTREAM_PORT="$UP" FENCES="$2" SAFE_METHODS="$3" SAFE_BODY="$4" WORKERS="workers = 2"
    if ! "$BIN" --config "$d/fencegate.toml" --check >"$d/check.log" 2>&1; then
        # A build from before [server] workers (FENCEGATE_BIN, for before/after
        # runs): its multi-thread runtime reads TOKIO_WORKER_THREADS instead.
        render "$here/fencegate.toml.in" "$d/fencegate.toml" PORT="${PORT[$name]}" ADMIN_PORT="${ADMIN_PORT[$name]}" \
            UPSTREAM_PORT="$UP" FENCES="$2" SAFE_METHODS="$3" SAFE_BODY="$4" WORKERS=""
        "$BIN" --config "$d/fencegate.toml" --check >"$d/check.log" 2>&1 || { cat "$d/check.log" >&2; die "$name config rejected"; }
    fi
    # RUST_LOG=warn: no access log (info), no per-request span (debug);
    # with ACCESS_LOG=on, info: the access log, to the stdout file.
    local level=warn
    [[ "$ACCESS_LOG" == on ]] && level=info
    start_proc "$name" "$d/fencegate.log" env -u FENCEGATE_ADMIN_TOKEN -u FENCEGATE_CONFIG \
        RUST_LOG=$level TOKIO_WORKER_THREADS=2 "$BIN" --config "$d/fencegate.toml"
    wait_ready "$name" "http://127.0.0.1:${ADMIN_PORT[$name]}/readyz" "http://127.0.0.1:${PORT[$name]}/objects/ready"
}
DEFAULT_METHODS='["GET", "HEAD", "OPTIONS"]'
[[ -n "${NEEDED[fencegate-memory]:-}" ]] && start_fencegate fencegate-memory 'store = "memory"' "$DEFAULT_METHODS" false
[[ -n "${NEEDED[fencegate-file]:-}" ]] &&
    start_fencegate fencegate-file "store = \"file\"
path = \"$work/fencegate-file/fences\"" "$DEFAULT_METHODS" false
[[ -n "${NEEDED[fencegate-unfenced]:-}" ]] && start_fencegate fencegate-unfenced 'store = "memory"' '["GET", "HEAD", "OPTIONS", "PUT"]' true
PORT[upstream]=$UP

# Smoke test: one request of each kind through every fencing contender must get 200.
for c in nginx-lua fencegate-memory fencegate-file; do
    [[ -n "${NEEDED[$c]:-}" ]] || continue
    code=$(curl -s -o "$work/$c/smoke.out" -w '%{http_code}' -X PUT -H 'X-Fencing-Token: 1' --data 'smoke' \
        "http://127.0.0.1:${PORT[$c]}/objects/smoke") || true
    [[ "$code" == 200 ]] || { cat "$work/$c/smoke.out" >&2 || true; fail_start "$c" "answered $code to a fenced PUT"; }
done

# ------------------------------------------------------------------- load ---

RESULTS=$work/results.tsv     # one line per wrk run
: >"$RESULTS"
WRK_SEQ=0
declare -A LAST_END=()        # "scenario contender" -> end of its last run (ms)
# fencegate settles a key (default `settle` 2s) when a client disconnects while
# the key's write is at the upstream -- which is what wrk does to every request in
# flight when it stops. Before the next run on the same keys, wait that out, or
# its first requests would queue behind the settled keys.
SETTLE_WAIT_MS=${SETTLE_WAIT_MS:-2500}

run_wrk() { # scenario contender kind round seconds conns
    local scenario=$1 contender=$2 kind=$3 round=$4 secs=$5 conns=$6
    local url="http://127.0.0.1:${PORT[$contender]}${URLPATH[$scenario]}"
    local -a args
    case $scenario in
        put) args=(-s "$here/keys.lua" "$url" -- PUT "$KEYS" 7) ;;
        get) args=(-s "$here/keys.lua" "$url" -- GET "$KEYS" -) ;;
        hotkey) args=(-s "$here/hot.lua" "$url") ;;
        churn) args=(-s "$here/close.lua" "$url") ;;
        raise) args=(-s "$here/raise.lua" "$url" -- "$KEYS" "$(((WRK_SEQ + 1) * 1000000000))") ;;
    esac
    [[ "$kind" == prime ]] && args+=(prime "$conns")
    WRK_SEQ=$((WRK_SEQ + 1))

    local settles=0
    [[ "$contender" == fencegate-memory || "$contender" == fencegate-file ]] && [[ "$scenario" != get ]] && settles=1
    if ((settles)) && [[ -n "${LAST_END[$scenario $contender]:-}" ]]; then
        local wait_ms=$((LAST_END[$scenario $contender] + SETTLE_WAIT_MS - $(now_ms)))
        ((wait_ms > 0)) && sleep "$((wait_ms / 1000)).$(printf '%03d' $((wait_ms % 1000)))"
    fi

    local -a pids
    mapfile -t pids < <(procs_of "$contender")
    local wlog=$work/wrk/$scenario.$contender.$kind.$round.log
    mkdir -p "$work/wrk"
    local t0 t1 m0 m1
    m0=$(fg_counters "$contender")
    t0=$(cpu_ticks "${pids[@]}"); local s0; s0=$(sys_ticks "${pids[@]}"); thread_ticks "${pids[@]}" > /tmp/thr0
    if ! wrk -t1 -c"$conns" -d"${secs}s" --latency "${args[@]}" >"$wlog" 2>&1; then
        cat "$wlog" >&2
        die "wrk failed ($scenario, $contender, $kind)"
    fi
    t1=$(cpu_ticks "${pids[@]}"); local s1; s1=$(sys_ticks "${pids[@]}"); thread_ticks "${pids[@]}" > /tmp/thr1; echo "== $contender $kind $round" >> /tmp/threads.log; join /tmp/thr0 /tmp/thr1 | awk '{printf "%s %s user=%d sys=%d\n", $1, $2, $5-$3, $6-$4}' >> /tmp/threads.log; echo "$scenario $contender $kind $round total=$((t1-t0)) sys=$((s1-s0))" >> "${SYS_LOG:-/tmp/sys.log}"
    LAST_END[$scenario $contender]=$(now_ms)
    m1=$(fg_counters "$contender")
    for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null || fail_start "$(proc_name "$contender")" "died during the load"
    done

    local line
    line=$(grep '^WRK_RESULT ' "$wlog" | tail -n 1) || { cat "$wlog" >&2; die "no result line from wrk ($wlog)"; }
    # scenario contender kind round conns ticks + WRK_RESULT fields (key=value)
    local -a c0 c1
    read -r -a c0 <<<"$m0"
    read -r -a c1 <<<"$m1"
    # fencegate's counters over the run: settled keys (a settle is counted when
    # its response is sent, so those of wrk's last requests do not show here),
    # marks raised on disk and commits (file store).
    line+=" settles=$((c1[0] - c0[0])) store_raises=$((c1[1] - c0[1])) store_commits=$((c1[2] - c0[2]))"
    echo "$scenario $contender $kind $round $conns $((t1 - t0)) ${line#WRK_RESULT }" >>"$RESULTS"
    awk -v s="$scenario" -v c="$contender" -v k="$kind" -v r="$round" -v ticks="$((t1 - t0))" -v hz="$CLK_TCK" '
        { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
        END {
            rps = v["requests"] / (v["duration_us"] / 1e6)
            err = v["connect"] + v["read"] + v["write"] + v["status"] + v["timeout"]
            cpu = v["requests"] > 0 ? ticks * 1e6 / hz / v["requests"] : 0
            if (k == "prime")
                printf "  %-7s %-19s %-6s %-3s %9d requests, every key answered           cpu %6.1f us/req%s\n",
                    s, c, k, r, v["requests"], cpu, (err > 0 ? "  ERRORS " err : "") > "/dev/stderr"
            else
                printf "  %-7s %-19s %-6s %-3s %9.0f req/s  p50 %7.0f us  p99 %7.0f us  cpu %6.1f us/req%s\n",
                    s, c, k, r, rps, v["p50_us"], v["p99_us"], cpu, (err > 0 ? "  ERRORS " err : "") > "/dev/stderr"
        }' <<<"$line"
}

for s in $SCENARIOS; do
    read -r -a who <<<"$(lineup "$s")"
    ((${#who[@]})) || continue
    log "scenario $s: ${who[*]}"
    for ((r = 1; r <= ROUNDS; r++)); do
        for c in "${who[@]}"; do
            if ((r == 1)); then
                # Put: give every key its mark first, so measured rounds are all
                # equal-token writes (the file store writes only on a raise).
                if [[ "$s" == put && ( "$c" == fencegate-memory || "$c" == fencegate-file ) ]]; then
                    run_wrk "$s" "$c" prime 0 600 "$CONNS"
                fi
                ((WARMUP > 0)) && run_wrk "$s" "$c" warmup 0 "$WARMUP" "$CONNS"
            fi
            run_wrk "$s" "$c" round "$r" "$ROUND_SECONDS" "$CONNS"
        done
    done
done

# --------------------------------------------------------------- report ---

RSS=$work/rss.tsv
: >"$RSS"
for c in $ALL_CONTENDERS; do
    [[ -n "${PID[$(proc_name "$c")]:-}" ]] || continue
    mapfile -t pids < <(procs_of "$c")
    echo "$c $(peak_rss_kib "${pids[@]}")" >>"$RSS"
done

commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ "$commit" != unknown ]] && [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    commit="$commit-dirty"
fi
nginx_v=$(nginx -v 2>&1 | sed 's/^nginx version: //')
haproxy_v=$(haproxy -v 2>&1 | awk 'NR == 1 { print $3 }')
wrk_v=$({ wrk -v 2>&1 || true; } | awk 'NR == 1 { print $2 }')
fg_v=$("$BIN" --version 2>&1 || true)

report() {
    echo "# fencegate load benchmark"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- machine: $(nproc) CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo unknown)), kernel $(uname -r), load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- tools: nginx $nginx_v, HAProxy $haproxy_v, wrk $wrk_v"
    echo "- fencegate: $fg_v, commit $commit ($BIN_ORIGIN)"
    echo "- load: wrk -t1 -c$CONNS, $ROUNDS interleaved round(s) of ${ROUND_SECONDS}s per contender, ${WARMUP}s warm-up, $KEYS keys, 16-byte bodies"
    if [[ "$ACCESS_LOG" == on ]]; then
        echo "- access logs: on (fencegate at info to its stdout file, nginx buffered to a file; HAProxy and the floor never)"
    else
        echo "- access logs: off"
    fi
    echo
    echo "**Only ratios within one run mean anything**: wrk, the upstream and the proxy share"
    echo "this machine's CPUs, and absolute numbers move with whatever else runs on it."
    echo "rps: best and median round. p50, p99, CPU: the best round. CPU: the contender's own"
    echo "processes (utime+stime), not the upstream's or wrk's. RSS: peak (VmHWM), summed over"
    echo "the contender's processes, at the end of the run. errors: non-2xx (>399) responses"
    echo "and socket errors over every run, warm-ups included; must be 0."
    awk -v scenarios="$SCENARIOS" -v keys="$KEYS" -v hz="$CLK_TCK" -v conns="$CONNS" \
        -v lineups="$(for s in $ALL_SCENARIOS; do printf '%s=%s;' "$s" "$(lineup "$s" | tr ' ' ',')"; done)" \
        -v refs="put=${REFERENCE[put]};get=${REFERENCE[get]};hotkey=${REFERENCE[hotkey]};raise=${REFERENCE[raise]};churn=${REFERENCE[churn]}" \
        -v titles="put=${TITLE[put]};get=${TITLE[get]};hotkey=${TITLE[hotkey]};raise=${TITLE[raise]};churn=${TITLE[churn]}" '
    function thousands(x,   s, out) {
        s = sprintf("%.0f", x); out = ""
        while (length(s) > 3) { out = "," substr(s, length(s) - 2) out; s = substr(s, 1, length(s) - 3) }
        return s out
    }
    function ms(us) { return sprintf("%.2f ms", us / 1000) }
    function ratio(a, b) { return (b > 0 && a != "") ? sprintf("×%.2f", a / b) : "-" }
    function median(list, n,   i, j, t, a) {
        for (i = 1; i <= n; i++) a[i] = list[i]
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function parse_map(text, m,   parts, n, i, eq) {
        n = split(text, parts, ";")
        for (i = 1; i <= n; i++) { eq = index(parts[i], "="); if (eq) m[substr(parts[i], 1, eq - 1)] = substr(parts[i], eq + 1) }
    }
    function name(c) { return c == "upstream" ? "upstream (direct)" : c }
    # Display width: "×" and "µ" are 2 bytes in UTF-8 but one column.
    function dlen(x,   t, n) { t = x; n = gsub(/×/, "", t) + gsub(/µ/, "", t); return length(x) - n }
    function cell(r, c, x) { T[r, c] = x; if (dlen(x) > W[c]) W[c] = dlen(x) }
    function flush_table(nrows, ncols,   r, c, line, pad, dash, k) {
        for (r = 0; r <= nrows; r++) {
            line = "|"
            for (c = 1; c <= ncols; c++) {
                pad = sprintf("%" (W[c] - dlen(T[r, c])) "s", "")
                line = line " " (c == 1 ? T[r, c] pad : pad T[r, c]) " |"
            }
            print line
            if (r == 0) {
                line = "|"
                for (c = 1; c <= ncols; c++) {
                    dash = ""
                    for (k = 0; k < W[c]; k++) dash = dash "-"
                    line = line (c == 1 ? "-" dash "-|" : "-" dash ":|")
                }
                print line
            }
        }
        delete T; delete W
    }
    FILENAME == ARGV[1] { rss[$1] = $2 / 1024; next }
    {
        # scenario contender kind round conns ticks key=value...
        s = $1; c = $2; kind = $3
        delete v
        for (i = 7; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        rps = v["requests"] / (v["duration_us"] / 1e6)
        err[s, c] += v["connect"] + v["read"] + v["write"] + v["status"] + v["timeout"]
        toterr += v["connect"] + v["read"] + v["write"] + v["status"] + v["timeout"]
        if (kind != "round") next
        n = ++nr[s, c]; rounds[s, c, n] = rps
        raises[s, c] += v["store_raises"]; commits[s, c] += v["store_commits"]; settles[s, c] += v["settles"]
        if (rps > best[s, c]) {
            best[s, c] = rps; p50[s, c] = v["p50_us"]; p99[s, c] = v["p99_us"]
            cpu[s, c] = v["requests"] > 0 ? $6 * 1e6 / hz / v["requests"] : 0
        }
    }
    END {
        parse_map(lineups, L); parse_map(refs, REF); parse_map(titles, TT)
        ns = split(scenarios, S, " ")
        for (si = 1; si <= ns; si++) {
            s = S[si]; nc = split(L[s], C, ",")
            if (nc == 0) continue
            ref = REF[s]; refname = (ref == "fencegate-memory") ? "memory" : ref
            printf "\n## %s: %s, %d connections\n\n", s, TT[s], conns
            split("contender|rps (best)|rps median|p50|p99|CPU µs/req|peak RSS MiB|rps ×" refname "|p99 ×" refname "|CPU ×" refname "|RSS ×" refname "|errors", H, "|")
            for (k = 1; k <= 12; k++) cell(0, k, H[k])
            row = 0
            for (ci = 1; ci <= nc; ci++) {
                c = C[ci]
                if (!((s, c) in nr)) continue
                delete list
                for (k = 1; k <= nr[s, c]; k++) list[k] = rounds[s, c, k]
                med[s, c] = median(list, nr[s, c])
                has_ref = ((s, ref) in nr)
                row++
                cell(row, 1, name(c))
                cell(row, 2, thousands(best[s, c]))
                cell(row, 3, thousands(med[s, c]))
                cell(row, 4, ms(p50[s, c]))
                cell(row, 5, ms(p99[s, c]))
                cell(row, 6, sprintf("%.1f", cpu[s, c]))
                cell(row, 7, (c in rss) ? sprintf("%.1f", rss[c]) : "-")
                cell(row, 8, has_ref ? ratio(best[s, c], best[s, ref]) : "-")
                cell(row, 9, has_ref ? ratio(p99[s, c], p99[s, ref]) : "-")
                cell(row, 10, has_ref ? ratio(cpu[s, c], cpu[s, ref]) : "-")
                cell(row, 11, (has_ref && (c in rss) && (ref in rss)) ? ratio(rss[c], rss[ref]) : "-")
                cell(row, 12, err[s, c] > 0 ? err[s, c] " !!" : "0")
            }
            flush_table(row, 12)
            if (s == "put" && ((s, "fencegate-file") in nr))
                printf "\nfencegate-file marks raised on disk during the measured rounds: %d (0 expected: equal tokens, and a priming run gave every key its mark)\n", raises[s, "fencegate-file"]
            if (s == "raise" && ((s, "fencegate-file") in nr) && commits[s, "fencegate-file"] > 0)
                printf "\nfencegate-file group commit over the measured rounds: %d raises in %d commits (%.1f per commit)\n", \
                    raises[s, "fencegate-file"], commits[s, "fencegate-file"], raises[s, "fencegate-file"] / commits[s, "fencegate-file"]
            for (ci = 1; ci <= nc; ci++)
                if (settles[s, C[ci]] > 0)
                    printf "\n!! %s settled %d keys during the measured rounds (an upstream timeout or lost connection)\n", C[ci], settles[s, C[ci]]
            if (s == "raise" && ((s, "fencegate-memory") in nr) && ((s, "fencegate-file") in nr))
                printf "\nfile / memory: best ×%.2f, median ×%.2f\n", best[s, "fencegate-file"] / best[s, "fencegate-memory"], \
                    med[s, "fencegate-file"] / med[s, "fencegate-memory"]
            if (s == "hotkey" && ((s, "fencegate-memory") in nr) && (("put", "fencegate-memory") in nr))
                printf "\nfencegate-memory, one key / %s keys (put): best ×%.2f, median ×%.2f (one holder: its writes share the key)\n", \
                    keys, best[s, "fencegate-memory"] / best["put", "fencegate-memory"], med[s, "fencegate-memory"] / med["put", "fencegate-memory"]
        }
        if (toterr > 0) printf "\n!! %d requests failed (non-2xx or socket errors): the rows marked !! are not valid.\n", toterr
    }' "$RSS" "$RESULTS"
}

report_file=$work/report.txt
report | tee "$report_file"

# Raw results, one line per wrk run (rounds, warm-ups, primes).
csv=$work/results.csv
awk -v hz="$CLK_TCK" '
    BEGIN { print "scenario,contender,kind,round,conns,seconds,requests,rps,p50_us,p99_us,mean_us,cpu_ticks,cpu_us_per_req,err_connect,err_read,err_write,err_status,err_timeout,peak_rss_mib,settles,store_raises,store_commits" }
    FILENAME == ARGV[1] { rss[$1] = $2 / 1024; next }
    {
        delete v
        for (i = 7; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        secs = v["duration_us"] / 1e6
        printf "%s,%s,%s,%s,%s,%.3f,%d,%.1f,%s,%s,%s,%s,%.2f,%s,%s,%s,%s,%s,%.1f,%s,%s,%s\n", $1, $2, $3, $4, $5, secs, v["requests"],
            v["requests"] / secs, v["p50_us"], v["p99_us"], v["mean_us"], $6, (v["requests"] > 0 ? $6 * 1e6 / hz / v["requests"] : 0),
            v["connect"], v["read"], v["write"], v["status"], v["timeout"], rss[$2], v["settles"], v["store_raises"], v["store_commits"]
    }' "$RSS" "$RESULTS" >"$csv"

if [[ -n "$OUT" ]]; then
    mkdir -p "$OUT"
    cp "$csv" "$report_file" "$OUT/"
    mkdir -p "$OUT/logs"
    cp -r "$work/wrk" "$OUT/logs/" 2>/dev/null || true
    for n in "${!PID[@]}"; do
        for f in "$work/$n"/*.log "$work/$n"/*.conf "$work/$n"/*.cfg "$work/$n"/*.toml; do
            if [[ -e "$f" ]]; then cp "$f" "$OUT/logs/$n.$(basename "$f")"; fi
        done
    done
    log "results: $OUT/results.csv (report: $OUT/report.txt, logs and configs: $OUT/logs/)"
fi

if grep -q '^!! ' "$report_file"; then
    exit 3
fi
exit 0
