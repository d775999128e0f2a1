# Sourced by benches/instructions.sh and benches/pgo/train.sh: free ports,
# waiting for a server, and the upstream both put their proxy in front of.

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
# for it. Sets UPSTREAM_PORT and UPSTREAM_PID; stop it with TERM, which
# nginx's master passes on to its worker (a KILL would leave the worker).
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
