#!/usr/bin/env bash
# Instructions per fenced PUT, counted by callgrind: fencegate, the fenced
# floor, the hyper floor (examples/hyper_floor.rs), nginx as a plain reverse
# proxy and nginx with a Lua fence check (the load bench's `nginx` and
# `nginx-lua`), each in front of the same nginx upstream, under the same load
# as the load bench's `put` scenario. Instruction counts do not move with
# what else the machine runs, so this is the figure to compare two builds by
# on a noisy machine.
#
#   benches/instructions.sh                     # builds, then each contender in turn: ~1.5 min once built
#   CONTENDERS=fencegate FENCEGATE_BIN=path/to/fencegate benches/instructions.sh
#   CONTENDERS="nginx nginx-lua" benches/instructions.sh   # no cargo build
#   CONTENDERS="fencegate nginx-lua nginx-lua-headers" FENCEGATE_BIN=path/to/fencegate benches/instructions.sh
#
# `nginx-lua-headers` is `nginx-lua` made to put on the wire what fencegate's
# contract does besides the fence: `X-Forwarded-For`, `-Proto` and `-Host`
# upstream, and `X-Request-Id` (the client's, or nginx's `$request_id`)
# upstream and on every response. `nginx-lua` as the load bench runs it sets
# none of them.
#
# Knobs (environment): CONTENDERS ("fencegate fenced-floor hyper-floor nginx
# nginx-lua"), SECONDS_MEASURED (10), CONNS (64), KEYS (10000), ACCESS_LOG
# (on; "off" leaves the access lines of fencegate, the fenced floor and the
# nginx contenders out), FENCEGATE_BIN and HYPER_FLOOR_BIN (use these binaries, skip
# `cargo build`), OUT (a directory for the callgrind files and logs; a temp
# dir otherwise).
#
# Every key is given its mark before counting (a first mark costs a new
# entry), then the counters are zeroed, wrk runs SECONDS_MEASURED seconds
# and the count since the zero is divided by the requests wrk saw answered.
# Every request carries token 7, the mark priming gave its key: no fencing
# contender writes a mark while counted. Under callgrind the proxy runs ~50x
# slower, so a run answers a few thousand requests: counts move by about
# ±300 instructions per request from run to run with how many requests each
# wake of a task carries. Read a difference smaller than that as none.
#
# The nginx contenders are the load bench's configs (benches/load/proxy-nginx
# .conf.in and proxy-nginx-lua.conf.in, the Lua check inline in the latter)
# with one change: `master_process off;` and `worker_processes 1;`, so the
# one process valgrind starts, and callgrind_control zeroes and dumps, is
# the one that serves. The access log, when on, is the load bench's:
# buffered to a file. LuaJIT writes machine code at run time, which
# valgrind notices only with `--smc-check=all-non-file` (without it, it may
# run a stale translation of rewritten code); with the flag, nginx-lua runs
# under callgrind as shipped, JIT on and `lua_code_cache on` (the default),
# no `jit.off()` needed: valgrind 3.19, Debian 12's libnginx-mod-http-lua
# 0.10.23 on LuaJIT 2.1-20230119. Keep it on: with `jit.off()` the check
# counted ~11k instructions more per request (docs/perf-log.md). The flag adds checks to valgrind's
# translations, not to the instructions counted; plain nginx runs with it
# too, so the two run alike.
#
# Needs (Debian packages): valgrind, nginx, wrk, curl; libnginx-mod-http-lua
# for nginx-lua and nginx-lua-headers.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
CONTENDERS=${CONTENDERS:-"fencegate fenced-floor hyper-floor nginx nginx-lua"}
SECONDS_MEASURED=${SECONDS_MEASURED:-10}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
ACCESS_LOG=${ACCESS_LOG:-on}

die() { echo "instructions.sh: $*" >&2; exit 1; }
declare -A PACKAGE=([valgrind]=valgrind [callgrind_control]=valgrind [nginx]=nginx [wrk]=wrk [curl]=curl)
for tool in valgrind callgrind_control nginx wrk curl; do
    command -v "$tool" >/dev/null || die "needs $tool: install the Debian package ${PACKAGE[$tool]} (apt-get install ${PACKAGE[$tool]})"
done
[[ "$ACCESS_LOG" == on || "$ACCESS_LOG" == off ]] || die "ACCESS_LOG must be on or off, got '$ACCESS_LOG'"
build=()
for contender in $CONTENDERS; do
    case $contender in
        fencegate) [[ -n "${FENCEGATE_BIN:-}" ]] || build+=(--bin fencegate) ;;
        fenced-floor | hyper-floor) [[ -n "${HYPER_FLOOR_BIN:-}" ]] || build+=(--example hyper_floor) ;;
        nginx) ;;
        nginx-lua | nginx-lua-headers)
            # The paths proxy-nginx-lua.conf.in loads its modules from.
            for module in ndk_http_module ngx_http_lua_module; do
                [[ -f /usr/lib/nginx/modules/$module.so ]] ||
                    die "nginx-lua needs /usr/lib/nginx/modules/$module.so: install the Debian package libnginx-mod-http-lua (apt-get install libnginx-mod-http-lua), or leave nginx-lua out of CONTENDERS"
            done
            ;;
        *) die "unknown contender '$contender' (fencegate, fenced-floor, hyper-floor, nginx, nginx-lua, nginx-lua-headers)" ;;
    esac
done

# Only what a contender needs and no *_BIN names (a target named twice is built once).
if ((${#build[@]})); then
    (cd "$repo" && cargo build --release --locked "${build[@]}" >&2) || die "cargo build failed"
    target_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
fi
FENCEGATE_BIN=${FENCEGATE_BIN:-${target_dir:-}/release/fencegate}
HYPER_FLOOR_BIN=${HYPER_FLOOR_BIN:-${target_dir:-}/release/examples/hyper_floor}

OUT=${OUT:-$(mktemp -d -t fencegate-instructions-XXXXXX)}
mkdir -p "$OUT"
source "$here/upstream.sh"
trap stop_started EXIT

# The upstream: the load bench's nginx, one worker, 200 "ok" to everything.
start_upstream "$OUT/upstream" || die "the upstream nginx did not start (see $OUT/upstream)"
up_port=$UPSTREAM_PORT
# The nginx contenders' configs say the same of the user they run as.
user_line="# (not root)"
[[ "$(id -u)" == 0 ]] && user_line="user root;"

level=warn
[[ "$ACCESS_LOG" == on ]] && level=info
# nginx's idle upstream connections: as in the load bench, never fewer than
# the client connections, so no counted request opens one.
keepalive=$((CONNS > 128 ? CONNS : 128))
# A proxy contender's nginx: the load bench's config, rendered as run.sh
# does, then one process that serves (see the top of this file).
nginx_contender() { # template dir port
    local access_log="access_log off;"
    [[ "$ACCESS_LOG" == on ]] && access_log="access_log $2/access.log combined buffer=64k flush=1s;"
    sed -e "s|@USER_LINE@|$user_line|" -e "s|@DIR@|$2|g" -e "s|@PORT@|$3|" -e "s|@UPSTREAM_PORT@|$up_port|" \
        -e "s|@KEEPALIVE@|$keepalive|" -e "s|@ACCESS_LOG_LINE@|$access_log|" \
        -e 's|^worker_processes [0-9]*;|worker_processes 1;\nmaster_process off;|' "$1" >"$2/nginx.conf"
    grep -q '^master_process off;' "$2/nginx.conf" && grep -q '^daemon off;' "$2/nginx.conf" ||
        die "$1 no longer has the worker_processes and daemon lines this script rewrites"
    if grep -qE '@[A-Z_]+@' "$2/nginx.conf"; then die "$1 has a placeholder this script does not fill in (see $2/nginx.conf)"; fi
    nginx -t -q -p "$2/" -c "$2/nginx.conf" -e "$2/error.log" >"$2/check.log" 2>&1 ||
        die "nginx rejected $2/nginx.conf (see $2/check.log)"
}
declare -A PER_REQUEST=()

for contender in $CONTENDERS; do
    port=$(free_port)
    d=$OUT/$contender
    mkdir -p "$d"
    tool=(valgrind --tool=callgrind --callgrind-out-file="$d/callgrind.out")
    case $contender in
        fencegate)
            bench_config "$d" "$port" "$(free_port)" memory "$level"
            cmd=("$FENCEGATE_BIN" --config "$d/fencegate.toml")
            ;;
        fenced-floor) cmd=("$HYPER_FLOOR_BIN" "127.0.0.1:$port" "127.0.0.1:$up_port" 2 fence) ;;
        hyper-floor) cmd=("$HYPER_FLOOR_BIN" "127.0.0.1:$port" "127.0.0.1:$up_port" 2) ;;
        nginx | nginx-lua)
            nginx_contender "$here/load/proxy-$contender.conf.in" "$d" "$port"
            cmd=(nginx -p "$d/" -c "$d/nginx.conf" -e "$d/error.log")
            tool+=(--smc-check=all-non-file)
            ;;
        nginx-lua-headers)
            nginx_contender "$here/load/proxy-nginx-lua.conf.in" "$d" "$port"
            # The headers fencegate sets, as an nginx user sets them.
            sed -i -e 's|^\( *\)lua_shared_dict fences|\1map $http_x_request_id $req_id { default $http_x_request_id; "" $request_id; }\n&|' \
                -e 's|^\( *\)proxy_set_header Connection "";|&\n\1proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\1proxy_set_header X-Forwarded-Proto $scheme;\n\1proxy_set_header X-Forwarded-Host $host;\n\1proxy_set_header X-Request-Id $req_id;\n\1add_header X-Request-Id $req_id always;|' \
                "$d/nginx.conf"
            [[ "$(grep -c 'X-Request-Id \$req_id' "$d/nginx.conf")" == 2 ]] ||
                die "proxy-nginx-lua.conf.in no longer has the lines nginx-lua-headers adds its headers after"
            nginx -t -q -p "$d/" -c "$d/nginx.conf" -e "$d/error.log" >"$d/check.log" 2>&1 ||
                die "nginx rejected $d/nginx.conf (see $d/check.log)"
            cmd=(nginx -p "$d/" -c "$d/nginx.conf" -e "$d/error.log")
            tool+=(--smc-check=all-non-file)
            ;;
    esac
    # RUST_LOG: the fenced floor's log level (fencegate's config says the same).
    RUST_LOG=$level "${tool[@]}" "${cmd[@]}" >"$d/stdout.log" 2>"$d/stderr.log" &
    pid=$!
    PIDS+=("$pid")
    url="http://127.0.0.1:$port/objects/put/"
    wait_up "http://127.0.0.1:$port/" || die "$contender did not start (see $d)"
    # Every key gets its mark first: the load bench primes its keys too.
    wrk -t1 -c"$CONNS" -d300s -s "$here/load/keys.lua" "$url" -- PUT "$KEYS" 7 prime "$CONNS" >"$d/prime.wrk" 2>&1 ||
        die "$contender: priming failed (see $d/prime.wrk)"
    [[ "$(sed -n 's/.*WRK_RESULT.* status=\([0-9]*\).*/\1/p' "$d/prime.wrk")" == 0 ]] ||
        die "$contender: priming got answers over 399, or no result line (see $d/prime.wrk)"
    callgrind_control -z "$pid" >/dev/null 2>&1
    wrk -t1 -c"$CONNS" -d"${SECONDS_MEASURED}s" -s "$here/load/keys.lua" "$url" -- PUT "$KEYS" 7 >"$d/measured.wrk" 2>&1 ||
        die "$contender: wrk failed (see $d/measured.wrk)"
    callgrind_control -d "$pid" >/dev/null 2>&1
    # The fence was there and saw the marks priming gave: a token below a
    # key's mark (7) is refused. Asked after the dump, so it is not counted.
    case $contender in
        fencegate | fenced-floor | nginx-lua | nginx-lua-headers)
            stale=$(curl -s -o /dev/null -w '%{http_code}' --max-time 30 -X PUT -H 'X-Fencing-Token: 6' --data-binary x "${url}k0")
            [[ "$stale" == 409 ]] || die "$contender: a stale token got $stale, not 409: the fence did not see the primed marks (see $d)"
            ;;
    esac
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    result=$(grep -o 'WRK_RESULT.*' "$d/measured.wrk") || die "$contender: no result line (see $d/measured.wrk)"
    requests=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$result")
    bad=$(sed -n 's/.* status=\([0-9]*\).*/\1/p' <<<"$result")
    [[ -n "$requests" && "$requests" -gt 0 && -n "$bad" ]] || die "$contender: the result line has no request count or status count (see $d/measured.wrk)"
    [[ "$bad" == 0 ]] || die "$contender: $bad answers over 399 (see $d)"
    dump=$(ls -t "$d"/callgrind.out.* | head -1)
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    PER_REQUEST[$contender]=$((total / requests))
    echo "$contender: $requests requests, ${PER_REQUEST[$contender]} instructions per request ($dump)" >&2
done

ratio() { # contender reference: "×a/b", or nothing when the reference was not run
    [[ -n "${PER_REQUEST[$2]:-}" ]] || return 0
    awk -v a="${PER_REQUEST[$1]}" -v b="${PER_REQUEST[$2]}" 'BEGIN {printf "×%.2f", a / b}'
}
echo
echo "| contender | instructions per fenced PUT | ×nginx-lua | ×hyper-floor |"
echo "|---|---:|---:|---:|"
for contender in $CONTENDERS; do
    echo "| $contender | ${PER_REQUEST[$contender]} | $(ratio "$contender" nginx-lua) | $(ratio "$contender" hyper-floor) |"
done
echo
# Whether the Rust contenders this script built have the optimization
# profile (benches/pgo/rustc-wrapper): FENCEGATE_PGO=off builds them
# without. (A build cargo made earlier, before a profile or without it, is
# reused as it is: compare with fresh target directories.)
pgo=
case " $CONTENDERS " in
    *" fencegate "* | *" fenced-floor "* | *" hyper-floor "*)
        pgo="; Rust contenders given as binaries"
        ((${#build[@]})) && pgo="; Rust contenders built with the optimization profile: ${FENCEGATE_PGO:-on}"
        ;;
esac
echo "access log: $ACCESS_LOG; $CONNS connections, $KEYS keys primed, ${SECONDS_MEASURED}s counted$pgo; $(nginx -v 2>&1 | sed 's/^nginx version: //'); files in $OUT"
