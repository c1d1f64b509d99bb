#!/usr/bin/env bash
# The request path's latency and throughput (issue 30's goals), in one run: starts
# `tessera serve --fleet synthetic:1000 --rate-limit 0` on a fresh store, then runs
#   1. `tessera bench api --rate 1000 --clients 50`  (open loop: create p50/p99, request → running)
#   2. `tessera bench api --clients 200`             (closed loop: creations/s and reads/s)
# each against its own fresh server, and prints the bench's report with the server's CPU
# seconds over the run and its CPU per creation and per read over those phases (utime + stime
# from /proc/PID/stat), which a loaded machine does not change the way it changes latencies.
#
# Usage: scripts/bench-api.sh [BINARY [DATABASE_URL]]   (default target/release/tessera, SQLite)
#   With DATABASE_URL (postgres://…), the server keeps its state in that PostgreSQL database,
#   which should be empty: give each phase its own (PHASES=open …, then PHASES=closed …).
# Environment: CREATES (default 10000), READS (default 50000), PORT (default 18095),
#   BENCH_THREADS (the load generator's worker threads, default 1), PHASES (default
#   "open closed").
set -euo pipefail
bin=${1:-target/release/tessera}
db=${2:-}
creates=${CREATES:-10000}
reads=${READS:-50000}
port=${PORT:-18095}
threads=${BENCH_THREADS:-1}
phases=${PHASES:-open closed}
[ -x "$bin" ] || { echo "error: $bin is not an executable (cargo build --release -p tessera)" >&2; exit 2; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT

cpu_s() { # utime + stime of $pid in seconds
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$pid/stat"
}

start() { # data dir
  local args=(serve --fleet synthetic:1000 --listen "127.0.0.1:$port" --data-dir "$1" --rate-limit 0)
  [ -n "$db" ] && args+=(--database "$db")
  "$bin" "${args[@]}" >"$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do grep -q "^Admin token: " "$1.log" 2>/dev/null && break; sleep 0.1; done
  admin=$(sed -n 's/^Admin token: //p' "$1.log")
  [ -n "$admin" ] || { echo "error: the server did not start:" >&2; cat "$1.log" >&2; exit 1; }
}

run() { # title, bench arguments...
  local title=$1
  shift
  start "$work/data-$RANDOM"
  local c0
  c0=$(cpu_s)
  echo "== $title: tessera bench api $*"
  "$bin" bench api --server "http://127.0.0.1:$port" --token "$admin" --threads "$threads" --server-pid "$pid" "$@"
  echo "server CPU: $(awk -v a="$c0" -v b="$(cpu_s)" 'BEGIN {printf "%.2f", b - a}') s"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for phase in $phases; do
  case $phase in
    open) run "open loop" --rate 1000 --clients 50 --creates "$creates" --reads 0 ;;
    closed) run "closed loop" --clients 200 --creates "$creates" --reads "$reads" ;;
    *) echo "error: PHASES: $phase is not open or closed" >&2; exit 2 ;;
  esac
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
