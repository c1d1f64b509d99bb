#!/usr/bin/env bash
# Deep pages of the console's workload list: page 201 (rows 10,001–10,050) of 12,000 workloads
# in each sort, p50/p99 over N requests (curl's time to the last byte on loopback), as the
# platform admin and as a member of the tenant. A build whose pager carries a cursor is walked
# there through its Next links (200 pages); an older build's `page=200` is asked directly.
# Usage: scripts/bench-console-deep.sh [TESSERA_BINARY] [N]   (default target/release/tessera, 100)
set -euo pipefail
bin=${1:-target/release/tessera}
n=${2:-100}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
port=18473
"$bin" serve --fleet seed --listen "127.0.0.1:$port" --data-dir "$work/data" --rate-limit 0 >"$work/out" 2>/dev/null &
for _ in $(seq 100); do grep -q "console http" "$work/out" 2>/dev/null && break; sleep 0.1; done
admin=$(sed -n 's/^Admin token: //p' "$work/out")
base="http://127.0.0.1:$port"
api() { curl -sf -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' -X "$1" "$base$2" ${3:+-d "$3"}; }
api POST /api/v1/tenants '{"name":"vision"}' >/dev/null
api POST /api/v1/tenants/vision/projects '{"name":"train"}' >/dev/null
member=$(api POST /api/v1/tokens '{"tenant":"vision","role":"member"}' | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
# 12,000 short workloads (names in an order unlike their ids), four requests at a time: most
# have ended by the time the pages are read, the rest run or wait.
seq 12000 | xargs -P 4 -I{} sh -c '
  i={}; name=$(printf "w%05d" $(( (i * 7919) % 12000 )))
  curl -sf -o /dev/null -H "Authorization: Bearer '"$admin"'" -H "Content-Type: application/json" \
    -X POST "'"$base"'/api/v1/workloads" \
    -d "{\"tenant\":\"vision\",\"project\":\"train\",\"name\":\"$name\",\"shape\":{\"fraction\":250},\"duration_s\":1}"'
signin() { # token -> cookie jar of a console session
  local jar="$work/jar-$RANDOM"
  ft=$(curl -s -c "$jar" "$base/console/signin" | sed -n 's/.*name="form_token" value="\([^"]*\)".*/\1/p')
  curl -s -o /dev/null -b "$jar" -c "$jar" --data-urlencode "token=$1" --data-urlencode "form_token=$ft" "$base/console/signin"
  echo "$jar"
}
next_of() { # jar path -> the page's Next link
  curl -s -b "$1" "$base$2" | sed -n 's/.*<a href="\([^"]*\)" rel="next">.*/\1/p' | sed 's/&amp;/\&/g; s/&#38;/\&/g'
}
deep() { # jar sort -> the path of page 201
  local first="/console/workloads?sort=$2"
  if next_of "$1" "$first" | grep -q 'cursor='; then
    local path=$first
    for _ in $(seq 200); do path=$(next_of "$1" "$path"); done
    echo "$path"
  else
    echo "/console/workloads?sort=$2&page=200"
  fi
}
measure() { # jar name path
  for _ in $(seq "$n"); do
    curl -s -o /dev/null -b "$1" -w '%{time_total}\n' "$base$3"
  done | sort -n | awk -v name="$2" '{t[NR]=$1} END {printf "%-28s p50 %6.1f ms  p99 %6.1f ms\n", name, t[int(NR*0.5)]*1000, t[int(NR*0.99)]*1000}'
}
echo "seed fleet, 12,000 workloads, page 201 of 50 rows, $n requests each:"
for who in admin member; do
  if [ "$who" = admin ]; then jar=$(signin "$admin"); else jar=$(signin "$member"); fi
  for sort in newest oldest name state; do
    path=$(deep "$jar" "$sort")
    rows=$(curl -s -b "$jar" "$base$path" | grep -c '<tr id="w-' || true)
    measure "$jar" "$who $sort ($rows rows)" "$path"
  done
done
