# Sourced by benches/instructions.sh and benches/pgo/train.sh: free ports,
# waiting for a server, the upstream both put their proxy in front of, the
# fencegate config both run it with, and stopping what they started.

# What the script started: PIDS are killed at the end, the upstream
# (UPSTREAM_PID, set by start_upstream) stopped.
PIDS=()
UPSTREAM_PID=

# Kills every process in PIDS, and stops the upstream with TERM: nginx's
# master takes its worker with it only on a signal it handles. For `trap
# ... EXIT`.
stop_started() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    if [[ -n "$UPSTREAM_PID" ]]; then
        kill -TERM "$UPSTREAM_PID" 2>/dev/null || true
        wait "$UPSTREAM_PID" 2>/dev/null || true
    fi
}

# A port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits until `url` answers, for at most a minute.
wait_up() { # url
    for _ in $(seq 300); do
        curl -s -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.2
    done
    return 1
}

# Starts the load bench's nginx upstream (one worker, 200 "ok" to
# everything) on a free port, with its config and logs in `dir`, and waits
# for it. Sets UPSTREAM_PORT and UPSTREAM_PID (stop_started stops it).
start_upstream() { # dir
    local dir=$1 user_line="# (not root)"
    local benches
    benches=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    UPSTREAM_PORT=$(free_port)
    [[ "$(id -u)" == 0 ]] && user_line="user root;"
    mkdir -p "$dir"
    sed -e "s|@USER_LINE@|$user_line|" -e "s|@DIR@|$dir|g" -e "s|@PORT@|$UPSTREAM_PORT|" \
        "$benches/load/upstream-nginx.conf.in" >"$dir/nginx.conf"
    nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout.log" 2>&1 &
    UPSTREAM_PID=$!
    wait_up "http://127.0.0.1:$UPSTREAM_PORT/"
}

# fencegate's config for these benches, written to `dir`/fencegate.toml:
# `listen` and `admin` ports, two workers, fences in `store` (a file store
# under `dir`/fences), the log at `level`, and one route, /objects/ to the
# upstream (start_upstream first), keyed by path.
bench_config() { # dir listen admin store level
    local dir=$1 path=
    [[ "$4" == file ]] && path="path = \"$dir/fences\""
    mkdir -p "$dir"
    cat >"$dir/fencegate.toml" <<EOF
[server]
listen = "127.0.0.1:$2"
workers = 2
[admin]
listen = "127.0.0.1:$3"
[fences]
store = "$4"
$path
[log]
level = "$5"
[[route]]
name = "objects"
prefix = "/objects/"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
key = "{path}"
EOF
}
