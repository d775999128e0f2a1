#!/usr/bin/env bash
# Makes fencegate's profile for profile-guided optimization
# (benches/pgo/fencegate.profdata, which benches/pgo/rustc-wrapper hands to
# rustc in every optimized build; benches/README.md, "Profile-guided
# optimization"). Run it again after changing code on the request path: a
# function changed since the profile was made is compiled as without one.
#
#   benches/pgo/train.sh          # ~12 min: an instrumented build, then ~1 min of traffic
#
# 1. Builds fencegate instrumented (`-Cprofile-generate`; the release profile,
#    in target/pgo-generate, so the release build is left alone).
# 2. Runs it in front of the load bench's nginx upstream and sends it what
#    a proxy in front of storage sees, once with the memory store and once
#    with the file store (the default): a holder's fenced PUTs over 10,000
#    keys at their marks, GETs passed through, raised tokens, refusals
#    (stale, missing and malformed tokens, no route), and the admin API.
#    The access log is on, as shipped.
# 3. Merges what the runs counted into benches/pgo/fencegate.profdata
#    (only the functions that ran at least PRUNE_BELOW times) and writes the toolchain that
#    made it to benches/pgo/toolchain.txt (the wrapper applies the profile
#    only with that LLVM; the Dockerfile builds with that rustc).
#
# Knobs (environment): TRAIN_SECONDS (20: the fenced PUTs of each run),
# PRUNE_BELOW (1000: functions that ran fewer times are left out),
# LLVM_PROFDATA (found in the toolchain's llvm-tools otherwise:
# `rustup component add llvm-tools`).
#
# Needs (Debian packages): nginx, wrk, curl.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
benches=$repo/benches
TRAIN_SECONDS=${TRAIN_SECONDS:-20}
PRUNE_BELOW=${PRUNE_BELOW:-1000}

die() { echo "train.sh: $*" >&2; exit 1; }
for tool in nginx wrk curl python3; do
    command -v "$tool" >/dev/null || die "needs $tool"
done
if [[ -z "${LLVM_PROFDATA:-}" ]]; then
    LLVM_PROFDATA=$(ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1)
fi
[[ -x "${LLVM_PROFDATA:-}" ]] ||
    die "needs llvm-profdata of the toolchain's LLVM: rustup component add llvm-tools (or set LLVM_PROFDATA)"
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
[[ "$("$LLVM_PROFDATA" --version)" == *"LLVM version $llvm."* ]] ||
    die "$LLVM_PROFDATA is not of rustc's LLVM ($llvm)"

work=$(mktemp -d -t fencegate-pgo-XXXXXX)
source "$benches/upstream.sh"
trap 'stop_started; rm -rf "$work"' EXIT

echo "building fencegate instrumented (target/pgo-generate)..." >&2
(cd "$repo" && FENCEGATE_PGO=off RUSTFLAGS="-Cprofile-generate=$work/raw" CARGO_TARGET_DIR="$repo/target/pgo-generate" \
    cargo build --release --locked --bin fencegate >&2) || die "the instrumented build failed"
bin=$repo/target/pgo-generate/release/fencegate

# The upstream: the load bench's nginx, 200 "ok" to everything.
start_upstream "$work/upstream" || die "the upstream nginx did not start (see $work/upstream)"

# One run of the traffic against a fencegate with `store`.
run() { # store
    local port admin d=$work/$1
    port=$(free_port)
    admin=$(free_port)
    bench_config "$d" "$port" "$admin" "$1" info
    "$bin" --config "$d/fencegate.toml" >"$d/stdout.log" 2>"$d/stderr.log" &
    local pid=$!
    PIDS+=("$pid")
    wait_up "http://127.0.0.1:$admin/healthz" || die "fencegate ($1 store) did not start (see $d)"
    local url="http://127.0.0.1:$port/objects/put/"
    # Marks first, then the holder's writes at them, then reads.
    wrk -t1 -c64 -d300s -s "$benches/load/keys.lua" "$url" -- PUT 10000 7 prime 64 >"$d/prime.wrk" 2>&1
    wrk -t1 -c64 -d"${TRAIN_SECONDS}s" -s "$benches/load/keys.lua" "$url" -- PUT 10000 7 >"$d/put.wrk" 2>&1
    wrk -t1 -c64 -d5s -s "$benches/load/keys.lua" "$url" -- GET 10000 >"$d/get.wrk" 2>&1
    wrk -t1 -c16 -d3s -s "$benches/load/keys.lua" "$url" -- PUT 1000 6 >"$d/stale.wrk" 2>&1 || true
    for i in $(seq 200); do
        curl -s -o /dev/null -X PUT -H "X-Fencing-Token: $((i + 8))" --data-binary "raised $i" "${url}k$i"
        curl -s -o /dev/null -X PUT --data-binary x "${url}k$i"
        curl -s -o /dev/null -X PUT -H 'X-Fencing-Token: x1' --data-binary x "${url}k$i"
        curl -s -o /dev/null -X DELETE -H "X-Fencing-Token: $((i + 8))" "${url}k$i"
        curl -s -o /dev/null "http://127.0.0.1:$port/elsewhere/$i"
        curl -s -o /dev/null "http://127.0.0.1:$admin/fences?key=/objects/put/k$i"
    done
    curl -s -o /dev/null "http://127.0.0.1:$admin/fences?prefix=/objects/&limit=100"
    curl -s -o /dev/null "http://127.0.0.1:$admin/metrics"
    # A clean exit writes the counts out.
    kill -TERM "$pid"
    wait "$pid" || die "fencegate ($1 store) did not exit cleanly (see $d)"
    echo "$1 store: $(grep -o 'requests=[0-9]*' "$d/put.wrk") fenced PUTs" >&2
}

run memory
run file

# Only the functions that ran at least PRUNE_BELOW times (the request path,
# not start-up and config parsing): the rest are compiled as without a
# profile, and the file stays about 1 MB instead of 7.
"$LLVM_PROFDATA" merge --text -o "$work/all.proftext" "$work"/raw/*.profraw
python3 - "$work/all.proftext" "$work/kept.proftext" "$PRUNE_BELOW" <<'PY'
import sys
source, kept_path, below = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = open(source).read().split("\n")
# The header: comments and the ":ir" flag, before the first function's name.
at = 0
while at < len(lines) and lines[at][:1] in ("#", ":"):
    at += 1
records = "\n".join(lines[at:]).strip("\n").split("\n\n")
def hot(record):
    fields = record.split("\n")
    counters = int(fields[fields.index("# Num Counters:") + 1])
    start = fields.index("# Counter Values:") + 1
    return max(int(v) for v in fields[start:start + counters]) >= below
kept = [r for r in records if hot(r)]
with open(kept_path, "w") as out:
    out.write("\n".join(lines[:at]) + "\n" + "\n\n".join(kept) + "\n")
print(f"{len(kept)} of {len(records)} functions ran at least {below} times", file=sys.stderr)
PY
"$LLVM_PROFDATA" merge --sparse -o "$here/fencegate.profdata" "$work/kept.proftext"
printf 'rustc %s\nllvm %s\n' "$(rustc -V | sed -n 's/^rustc \([0-9]*\.[0-9]*\).*/\1/p')" "$llvm" >"$here/toolchain.txt"
echo "wrote $here/fencegate.profdata ($(wc -c <"$here/fencegate.profdata") bytes, LLVM $llvm)" >&2
# Cargo rebuilds fencegate for a new profile (rustc lists the file among
# its inputs), but not the dependencies it has built: their builds are never
# looked at again.
echo "for the dependencies to be built with it too: cargo clean (or a new CARGO_TARGET_DIR) first" >&2
