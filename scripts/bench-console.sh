#!/usr/bin/env bash
# Console page benchmark: server-side render time (p50/p99 over N requests each, measured by
# curl's time to the last byte on loopback) and bytes per page (the page plus, on a first
# visit, every asset it links to), on the seed fleet with 1,000 workloads and on
# synthetic:1250 (10,000 GPUs) for the fleet map.
# Usage: scripts/bench-console.sh [TESSERA_BINARY] [N]   (default target/release/tessera, 200)
set -euo pipefail
bin=${1:-target/release/tessera}
n=${2:-200}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

start() { # fleet port -> sets base, admin
  "$bin" serve --fleet "$1" --listen "127.0.0.1:$2" --data-dir "$work/data-$2" --rate-limit 0 >"$work/out-$2" 2>/dev/null &
  for _ in $(seq 100); do grep -q "console http" "$work/out-$2" 2>/dev/null && break; sleep 0.1; done
  admin=$(sed -n 's/^Admin token: //p' "$work/out-$2")
  base="http://127.0.0.1:$2"
}
api() { curl -sf -o /dev/null -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' -X "$1" "$base$2" ${3:+-d "$3"}; }
signin() { # cookie jar of a console session for $admin
  jar="$work/jar-$RANDOM"
  ft=$(curl -s -c "$jar" "$base/console/signin" | sed -n 's/.*name="form_token" value="\([^"]*\)".*/\1/p')
  curl -s -o /dev/null -b "$jar" -c "$jar" --data-urlencode "token=$admin" --data-urlencode "form_token=$ft" "$base/console/signin"
  echo "$jar"
}
measure() { # name path
  local jar=$1 name=$2 path=$3
  for _ in $(seq "$n"); do
    curl -s -o /dev/null -b "$jar" -w '%{time_total}\n' "$base$path"
  done | sort -n | awk -v name="$name" '{t[NR]=$1} END {printf "%-22s p50 %6.1f ms  p99 %6.1f ms", name, t[int(NR*0.5)]*1000, t[int(NR*0.99)]*1000}'
  # Bytes on the wire as a browser gets them (gzip accepted).
  page=$(curl -s -b "$jar" "$base$path")
  bytes=$(curl -s -o /dev/null --compressed -b "$jar" -w '%{size_download}' "$base$path")
  assets=0
  for a in $(printf '%s' "$page" | grep -o '/assets/[0-9a-f]*/[^"]*' | sort -u); do
    assets=$((assets + $(curl -s -o /dev/null --compressed -w '%{size_download}' "$base$a")))
  done
  printf "  page %6d B  first visit with assets %7d B (gzip)\n" "$bytes" "$((bytes + assets))"
}

page_of() { # jar sort page -> the path of that page of the workload list, through its Next links
  local path="/console/workloads?sort=$2"
  for _ in $(seq $(($3 - 1))); do
    path=$(curl -s -b "$1" "$base$path" | sed -n 's/.*<a href="\([^"]*\)" rel="next">.*/\1/p' | sed 's/&amp;/\&/g; s/&#38;/\&/g')
  done
  echo "$path"
}

start seed 18471
api POST /api/v1/tenants '{"name":"vision"}'
api POST /api/v1/tenants/vision/projects '{"name":"train"}'
for i in $(seq 1000); do
  case $((i % 3)) in
    0) shape='{"mig":"1g.10gb"}' ;; 1) shape='{"fraction":250}' ;; *) shape='{"gpus":1}' ;;
  esac
  api POST /api/v1/workloads "{\"tenant\":\"vision\",\"project\":\"train\",\"name\":\"w$i\",\"shape\":$shape,\"duration_s\":86400}"
done
jar=$(signin)
echo "seed fleet (480 GPUs), 1,000 workloads, $n requests per page:"
measure "$jar" overview /console
measure "$jar" workloads /console/workloads
measure "$jar" "workloads by name p.11" "$(page_of "$jar" name 11)"
measure "$jar" "workloads by state p.11" "$(page_of "$jar" state 11)"
measure "$jar" "workloads oldest p.20" "$(page_of "$jar" oldest 20)"
measure "$jar" "workload timeline" /console/workloads/500
measure "$jar" "workload live part" /console/workloads/500/live
measure "$jar" "request form" /console/request
measure "$jar" quota "/console/quota?tenant=vision"
measure "$jar" tokens "/console/tokens?tenant=vision"
measure "$jar" fleet /console/fleet
measure "$jar" audit /console/audit
measure "$jar" queue /console/queue
measure "$jar" "allocation charts" /console/charts
measure "$jar" tenants /console/tenants

start synthetic:1250 18472
api POST /api/v1/tenants '{"name":"vision"}'
api POST /api/v1/tenants/vision/projects '{"name":"train"}'
for i in $(seq 1000); do
  api POST /api/v1/workloads "{\"tenant\":\"vision\",\"project\":\"train\",\"name\":\"w$i\",\"shape\":{\"mig\":\"1g.10gb\"},\"duration_s\":86400}"
done
jar=$(signin)
echo "synthetic:1250 (10,000 GPUs), 1,000 MIG slices placed, $n requests per page:"
measure "$jar" "fleet map" /console/fleet
measure "$jar" "fleet map, one pool" "/console/fleet?pool=serving"
measure "$jar" "fleet map, tenant" "/console/fleet?tenant=vision"
node=$(curl -s -H "Authorization: Bearer $admin" "$base/api/v1/nodes?pool=serving&limit=1" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
api POST /api/v1/sim/faults "{\"node\":\"$node\",\"gpu\":1,\"xid\":79}"
measure "$jar" "fleet map, unhealthy" "/console/fleet?health=unhealthy"
measure "$jar" "node detail" "/console/fleet/nodes/$node"
measure "$jar" "queue" /console/queue
measure "$jar" "allocation charts" /console/charts
