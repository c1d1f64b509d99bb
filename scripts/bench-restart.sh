#!/usr/bin/env bash
# Restart time of the control plane: starts `tessera serve` on an existing data directory and
# prints the milliseconds from the start of the process to the first successful
# GET /api/v1/health. The server is then stopped with kill -9, so that a repeated measurement
# again recovers from an unclean stop. Before that it waits SETTLE_S seconds (default 5, the
# lifecycle loop's first cycles and reconcile) and prints the process's peak resident memory
# (VmHWM) to stderr.
#
# Usage: scripts/bench-restart.sh BINARY DATA_DIR [PORT [SERVE ARGS...]]   (PORT default 18081)
#   e.g. scripts/bench-restart.sh target/release/tessera /tmp/big 18081 --fleet synthetic:10000
#
# To measure with a full store: start the server on DATA_DIR, create workloads with
#   tessera bench api --server http://127.0.0.1:PORT --token "$(cat DATA_DIR/admin-token)" --creates 10000
# stop it with kill -9, then run this script. Progress goes to stderr; stdout is the figure.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 BINARY DATA_DIR [PORT]" >&2
    exit 2
fi
bin=$1
dir=$2
port=${3:-18081}
shift $(($# < 3 ? $# : 3))
[ -x "$bin" ] || { echo "error: $bin is not an executable" >&2; exit 2; }
[ -f "$dir/tessera.db" ] || echo "note: $dir holds no store yet; this measures a first start" >&2

# One health probe with bash's /dev/tcp (no curl needed, no process start per probe).
healthy() {
    local line
    { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 1
    printf 'GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
    IFS= read -r -t 2 line <&3 2>/dev/null || line=
    exec 3<&- 3>&-
    [[ $line == "HTTP/1.1 200"* ]]
}

if healthy; then
    echo "error: something already answers on 127.0.0.1:$port" >&2
    exit 1
fi

log=$(mktemp)
start=$(date +%s%N)
"$bin" serve --data-dir "$dir" --listen "127.0.0.1:$port" "$@" >"$log" 2>&1 &
pid=$!
disown "$pid" # no "Killed" notice from the shell when it is stopped below
trap 'kill -9 $pid 2>/dev/null || true; rm -f "$log"' EXIT

deadline=$((start + 120 * 1000000000))
until healthy; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "error: the server exited:" >&2
        cat "$log" >&2
        exit 1
    fi
    if [ "$(date +%s%N)" -gt "$deadline" ]; then
        echo "error: no healthy answer within 120 s" >&2
        exit 1
    fi
    sleep 0.002
done
end=$(date +%s%N)
grep -E "rebuilt" "$log" | sed 's/^/server: /' >&2 || true
sleep "${SETTLE_S:-5}"
kill -0 "$pid" 2>/dev/null || { echo "error: the server exited:" >&2; cat "$log" >&2; exit 1; }
echo "peak RSS $(awk '/^VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$pid/status") after ${SETTLE_S:-5} s" >&2
echo $(((end - start) / 1000000))
