#!/usr/bin/env bash
# Runs every fuzz target for a bounded time and prints one summary line each.
# Not run by CI. See fuzz/README.md.
#
# Needs cargo-fuzz:      cargo install cargo-fuzz --locked
# cargo-fuzz needs nightly compiler flags (-Zsanitizer, -Cpasses=sancov). This
# script sets RUSTC_BOOTSTRAP=1 so they work on the stable toolchain; no
# nightly toolchain is needed.
#
# Usage:  fuzz/run.sh [TARGET...]          (default: all targets)
# Env:    FUZZ_SECONDS   seconds per target (default 60)
#         FUZZ_JOBS      targets run at once (default 1)
#         FUZZ_SANITIZER address (default) or none (faster, memory bugs in
#                        unsafe code go unseen; fencegate itself has none)
#
# Each target starts from the committed seeds in fuzz/seeds/TARGET and keeps
# what it finds in fuzz/corpus/TARGET (git-ignored). A crash is written to
# fuzz/artifacts/TARGET/ and reported; reproduce it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...
# Logs: fuzz/artifacts/logs/TARGET.log.
set -uo pipefail
cd "$(dirname "$0")"

export RUSTC_BOOTSTRAP=1
SECONDS_EACH="${FUZZ_SECONDS:-60}"
JOBS="${FUZZ_JOBS:-1}"
SANITIZER="${FUZZ_SANITIZER:-address}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz --locked" >&2
    exit 2
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

echo "building ${targets[*]} (sanitizer: $SANITIZER, RUSTC_BOOTSTRAP=1)"
cargo fuzz build -s "$SANITIZER" || exit 2

mkdir -p artifacts/logs
run_one() {
    local t="$1" dict="" log="artifacts/logs/$1.log"
    mkdir -p "corpus/$t" "artifacts/$t"
    [ -f "dicts/$t.dict" ] && dict="-dict=dicts/$t.dict"
    # -rss_limit_mb: the config target may parse large TOML; 2 GiB is libFuzzer's default too.
    cargo fuzz run -s "$SANITIZER" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 $dict \
        >"$log" 2>&1
    local rc=$?
    local runs crash
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    crash=$(grep -o "Test unit written to [^ ]*" "$log" | head -1 | sed 's/Test unit written to //')
    if [ "$rc" -eq 0 ] && [ -z "$crash" ]; then
        printf '%-14s ok     %6ss  %12s runs  corpus %s files\n' "$t" "$SECONDS_EACH" "${runs:-?}" \
            "$(find "corpus/$t" -type f | wc -l)"
    else
        printf '%-14s FAILED %6ss  %12s runs  exit %s  crash: %s  (log: fuzz/%s)\n' "$t" "$SECONDS_EACH" \
            "${runs:-?}" "$rc" "${crash:-none saved}" "$log"
        return 1
    fi
}

status=0
running=0
for t in "${targets[@]}"; do
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || status=1
        running=$((running - 1))
    fi
done
while [ "$running" -gt 0 ]; do
    wait -n || status=1
    running=$((running - 1))
done
exit "$status"
