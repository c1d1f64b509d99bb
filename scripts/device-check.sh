#!/usr/bin/env bash
# device-check.sh REPORT_DIR: checks what Tessera says about this machine's NVIDIA GPUs against
# the GPUs themselves, in one short run (under 5 minutes), and writes REPORT_DIR/report.json
# (pass/fail per check) and REPORT_DIR/device-check.log; what the checks read is kept under
# REPORT_DIR/raw/ so the report can be rebuilt with `tessera device-report REPORT_DIR`.
#
# It needs a release `tessera` built elsewhere and copied along (target/release/tessera, or
# $TESSERA_BIN; nothing is built here), `nvidia-smi`, and python3 with PyTorch for the
# workloads (without torch those checks fail with the reason; the rest still runs).
#
#  1. read-only: `tessera gpu-check` (discovery: model, UUIDs, PCI ids, MIG mode, GPU and
#     compute instances, NVLink, one telemetry sample) and the same facts from `nvidia-smi`;
#  2. `tessera serve --backend local` on loopback with a temporary data directory, a tenant and
#     a project, and a whole-GPU workload running a PyTorch matrix-multiply loop (~60 s) that
#     prints the GPU it sees; /metrics and nvidia-smi are sampled every second meanwhile;
#  3. a second such workload, cancelled: SIGTERM, SIGKILL after the grace period; then NVML
#     (`tessera gpu-check`) and nvidia-smi are read again.
# A GPU already in MIG mode is left as it is: its instances are adopted and shown, the
# whole-GPU workloads are skipped (they would need MIG mode off). The script never changes MIG
# mode, clocks, power limits or any other setting, and never resets a GPU: it only runs
# nvidia-smi's query commands, and Tessera never changes MIG mode by itself.
#
# Without a GPU it prints one line and exits 1. Exit status: 0 when every check passed.
#
# Test hooks (for machines without a GPU; the GPU machine needs none of them):
#   DEVICE_CHECK_NVIDIA_SMI=PATH   an nvidia-smi stand-in
#   DEVICE_CHECK_FAKE_GPUS=N       gpu-check and serve on Tessera's fake NVML (--fake-gpus N)
#   DEVICE_CHECK_WORKLOAD=sh       shell workloads that print what the PyTorch ones print
#   DEVICE_CHECK_SECONDS=S         length of the first workload's loop (default 60)
set -uo pipefail

usage() { echo "usage: scripts/device-check.sh REPORT_DIR" >&2; exit 2; }
if [[ "${1:-}" == "--collect" ]]; then mode=collect; shift; else mode=main; fi
[[ $# -eq 1 && -n "$1" ]] || usage
REPORT_DIR="$1"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
smi="${DEVICE_CHECK_NVIDIA_SMI:-nvidia-smi}"
bin="${TESSERA_BIN:-$here/target/release/tessera}"
py="${DEVICE_CHECK_PYTHON:-python3}"
fake=()
if [[ -n "${DEVICE_CHECK_FAKE_GPUS:-}" ]]; then fake=(--fake-gpus "$DEVICE_CHECK_FAKE_GPUS"); fi
TELEMETRY_MS=2000 # Tessera's telemetry interval during the check
GRACE_S=5         # grace between SIGTERM and SIGKILL
BUDGET_S=270      # the collection's time limit; the report is built after it
SECONDS_W1="${DEVICE_CHECK_SECONDS:-60}"

if [[ "$mode" == main ]]; then
  # No GPU: one line, non-zero.
  if ! command -v "$smi" >/dev/null 2>&1; then
    echo "device-check: no NVIDIA GPU on this machine (nvidia-smi not found); nothing was checked" >&2
    exit 1
  fi
  if ! timeout 30 "$smi" -L 2>/dev/null | grep -q '^GPU [0-9]'; then
    echo "device-check: no NVIDIA GPU on this machine (nvidia-smi -L lists none); nothing was checked" >&2
    exit 1
  fi
  if [[ ! -x "$bin" ]]; then
    echo "device-check: no tessera binary at $bin (copy a release build along, or set TESSERA_BIN)" >&2
    exit 1
  fi
  mkdir -p "$REPORT_DIR/raw" || exit 1
  REPORT_DIR="$(cd "$REPORT_DIR" && pwd)"
  rm -f "$REPORT_DIR"/raw/* "$REPORT_DIR/report.json"
  : >"$REPORT_DIR/device-check.log"
  echo "device-check: collecting into $REPORT_DIR (at most ${BUDGET_S} s)" >&2
  timeout --kill-after=10 "$BUDGET_S" bash "${BASH_SOURCE[0]}" --collect "$REPORT_DIR"
  rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "$(date -u +%H:%M:%S) collection stopped at its ${BUDGET_S} s limit" | tee -a "$REPORT_DIR/device-check.log" >&2
    printf '%s\t%s\t%s\n' "$(date +%s%3N)" budget.exceeded "$BUDGET_S" >>"$REPORT_DIR/raw/events.tsv"
  fi
  # Whatever the collection left running (it cleans up after itself unless it was killed).
  for f in "$REPORT_DIR"/raw/.pid-*; do
    [[ -e "$f" ]] || continue
    p="$(cat "$f")"
    [[ -n "$p" ]] && kill -9 "$p" 2>/dev/null
    rm -f "$f"
  done
  if [[ -f "$REPORT_DIR/raw/.data-dir" ]]; then
    data="$(cat "$REPORT_DIR/raw/.data-dir")"
    for p in "$data"/tessera/workloads/*/pid; do
      [[ -e "$p" ]] || continue
      g="$(awk '{print $1}' "$p")"
      [[ -n "$g" ]] && kill -9 -- "-$g" 2>/dev/null
    done
    [[ "$data" == */tessera-devcheck.* ]] && rm -rf "$data"
    rm -f "$REPORT_DIR/raw/.data-dir"
  fi
  "$bin" device-report "$REPORT_DIR" 2>&1 | tee -a "$REPORT_DIR/device-check.log"
  exit "${PIPESTATUS[0]}"
fi

# ---- collection (runs under `timeout`) ----
raw="$REPORT_DIR/raw"
log="$REPORT_DIR/device-check.log"
say() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$log" >&2; }
ev() { printf '%s\t%s\t%s\n' "$(date +%s%3N)" "$1" "${2:-}" >>"$raw/events.tsv"; }
t() { "$bin" "$@" 2>>"$log"; }

data="$(mktemp -d "${TMPDIR:-/tmp}/tessera-devcheck.XXXXXX")"
echo "$data" >"$raw/.data-dir"
serve_pid=""
sampler_pid=""
cleanup() {
  [[ -n "$sampler_pid" ]] && kill "$sampler_pid" 2>/dev/null
  if [[ -n "$serve_pid" ]] && kill -0 "$serve_pid" 2>/dev/null; then
    kill "$serve_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$serve_pid" 2>/dev/null
  fi
  # Workloads are process groups of their own; none may outlive the check.
  for p in "$data"/tessera/workloads/*/pid; do
    [[ -e "$p" ]] || continue
    g="$(awk '{print $1}' "$p")"
    [[ -n "$g" ]] && kill -9 -- "-$g" 2>/dev/null
  done
  rm -f "$raw"/.pid-* "$raw/.data-dir"
  rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 124' TERM INT

ev check.start "$(cat /proc/sys/kernel/hostname 2>/dev/null)"
ev telemetry_ms "$TELEMETRY_MS"
ev grace_s "$GRACE_S"
"$bin" --version >"$raw/tessera-version.txt" 2>&1

# 1. Read-only: what Tessera and nvidia-smi say about each GPU.
say "gpu-check and nvidia-smi queries"
query=index,uuid,name,pci.bus_id,pci.device_id,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu,power.draw,mig.mode.current,mig.mode.pending,driver_version,power.limit,clocks.applications.graphics,clocks.applications.memory,compute_mode,persistence_mode
small=index,uuid,name,pci.bus_id,pci.device_id,memory.total,memory.used,memory.free,utilization.gpu,mig.mode.current,driver_version
query_gpus() { # FILE
  timeout 30 "$smi" --query-gpu="$query" --format=csv,nounits >"$1" 2>>"$log" ||
    { say "nvidia-smi refused the full query; the smaller one"; timeout 30 "$smi" --query-gpu="$small" --format=csv,nounits >"$1" 2>>"$log"; }
}
query_gpus "$raw/smi-gpu.csv"
timeout 60 "$bin" gpu-check "${fake[@]}" >"$raw/gpu-check.json" 2>>"$log" || say "tessera gpu-check failed (see above)"
timeout 30 "$smi" -L >"$raw/smi-L.txt" 2>>"$log"
timeout 30 "$smi" nvlink -s >"$raw/smi-nvlink.txt" 2>&1
timeout 30 "$smi" mig -lgi >"$raw/smi-mig-lgi.txt" 2>&1
timeout 30 "$smi" mig -lci >"$raw/smi-mig-lci.txt" 2>&1
timeout 30 "$smi" --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,nounits >"$raw/smi-apps.csv" 2>>"$log"
mig_on="$(awk -F', *' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /^mig\.mode\.current/) c = i; next }
  c && $c == "Enabled" { print "yes"; exit }' "$raw/smi-gpu.csv" 2>/dev/null)"
mig_on="${mig_on:-no}"
if [[ "$mig_on" == yes ]]; then
  timeout 30 "$smi" mig -lgipp >"$raw/smi-mig-lgipp.txt" 2>&1
fi
ev mig "$mig_on"

# PyTorch for the workloads.
if [[ "${DEVICE_CHECK_WORKLOAD:-}" == sh ]]; then
  echo "shell workloads (test hook)" >"$raw/torch.txt"
  ev torch ok
elif timeout 90 "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' >"$raw/torch.txt" 2>&1 &&
  grep -q 'available True' "$raw/torch.txt"; then
  ev torch ok
else
  ev torch missing
  say "PyTorch with CUDA is not usable here: $(tail -1 "$raw/torch.txt")"
fi

# 2. The control plane on loopback.
say "tessera serve --backend local"
"$bin" serve --backend local "${fake[@]}" --node devcheck --listen 127.0.0.1:0 --data-dir "$data/tessera" \
  --sim-telemetry-ms "$TELEMETRY_MS" --grace-s "$GRACE_S" --rate-limit 0 --reconcile-s 5 \
  >"$raw/serve.log" 2>&1 &
serve_pid=$!
echo "$serve_pid" >"$raw/.pid-serve"
addr=""
for _ in $(seq 300); do
  addr="$(sed -n 's#.*console http://\([^/]*\)/.*#\1#p' "$raw/serve.log" | head -1)"
  [[ -n "$addr" ]] && break
  kill -0 "$serve_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z "$addr" ]]; then
  say "tessera serve did not come up: $(tail -3 "$raw/serve.log" | tr '\n' ' ')"
  ev serve.failed
  exit 1
fi
ev serve.ready "http://$addr"
export TESSERA_SERVER="http://$addr" TESSERA_TOKEN="$(cat "$data/tessera/admin-token")" XDG_CONFIG_HOME="$data/config"
t tenants create devcheck >>"$log" && t projects --tenant devcheck create ml >>"$log" || say "tenant or project not created"
t gpus -o json >"$raw/gpus-serve.json"
t pools -o json >"$raw/pools-before.json"

metrics() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time 2 -H "Authorization: Bearer $TESSERA_TOKEN" "$TESSERA_SERVER/metrics"
  else
    "$py" -c 'import os, urllib.request as u
r = u.Request(os.environ["TESSERA_SERVER"] + "/metrics", headers={"Authorization": "Bearer " + os.environ["TESSERA_TOKEN"]})
print(u.urlopen(r, timeout=2).read().decode())'
  fi
}
# Every second: Tessera's per-GPU series and nvidia-smi's view of the same moment.
sampler() {
  while :; do
    local at
    at="$(date +%s%3N)"
    { echo "# at_ms $at"; metrics 2>/dev/null | grep -E '^DCGM_FI_DEV_(GPU_UTIL|FB_USED)\{' | grep -v GPU_I_ID; } >>"$raw/metrics-samples.txt"
    timeout 5 "$smi" --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null |
      sed "s/^/$at, /" >>"$raw/smi-samples.csv"
    sleep 1
  done
}
sampler &
sampler_pid=$!
echo "$sampler_pid" >"$raw/.pid-sampler"

W1_PY='import os, time, torch
now = lambda: int(time.time() * 1000)
p = torch.cuda.get_device_properties(0)
uuid = getattr(p, "uuid", None)
print("devcheck visible=" + os.environ.get("CUDA_VISIBLE_DEVICES", ""), flush=True)
print("devcheck count=%d" % torch.cuda.device_count(), flush=True)
print("devcheck name=" + p.name, flush=True)
print("devcheck uuid=" + ("GPU-%s" % uuid if uuid is not None else "unknown"), flush=True)
n = 16384
a = torch.randn(n, n, device="cuda")
b = torch.randn(n, n, device="cuda")
c = torch.empty(n, n, device="cuda")
torch.cuda.synchronize()
print("devcheck compute-begin %d" % now(), flush=True)
end, it = time.time() + float(os.environ.get("DEVCHECK_SECONDS", "60")), 0
while time.time() < end:
    for _ in range(4):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    it += 4
print("devcheck compute-end %d iterations=%d" % (now(), it), flush=True)'
W2_PY='import signal, time, torch
now = lambda: int(time.time() * 1000)
signal.signal(signal.SIGTERM, lambda s, f: print("devcheck got-sigterm %d" % now(), flush=True))
n = 8192
a = torch.randn(n, n, device="cuda")
c = torch.empty(n, n, device="cuda")
torch.cuda.synchronize()
print("devcheck compute-begin %d" % now(), flush=True)
while True:
    torch.matmul(a, a, out=c)
    torch.cuda.synchronize()'
W1_SH='echo "devcheck visible=$CUDA_VISIBLE_DEVICES"; echo "devcheck count=1"; echo "devcheck name=shell"
echo "devcheck uuid=$CUDA_VISIBLE_DEVICES"; echo "devcheck compute-begin $(date +%s%3N)"; sleep "$DEVCHECK_SECONDS"
echo "devcheck compute-end $(date +%s%3N) iterations=0"'
W2_SH='trap "echo devcheck got-sigterm \$(date +%s%3N)" TERM; echo "devcheck compute-begin $(date +%s%3N)"
while :; do sleep 0.1; done'
if [[ "${DEVICE_CHECK_WORKLOAD:-}" == sh ]]; then w1=(sh -c "$W1_SH"); w2=(sh -c "$W2_SH"); else w1=("$py" -c "$W1_PY"); w2=("$py" -c "$W2_PY"); fi

# Host resources of each workload: what the machine has, up to 4 CPUs and 16 GiB.
cpus="$(nproc 2>/dev/null || echo 1)"
((cpus > 4)) && cpus=4
mem_gib="$(awk '/^MemTotal:/ { g = int($2 / 1048576 / 2); print (g < 1 ? 1 : g) }' /proc/meminfo)"
((mem_gib > 16)) && mem_gib=16
# The workload's ID from `tessera run -o json`.
run_id() { sed -n 's/^ *"id": *\([0-9]*\).*/\1/p' "$1" | head -1; }
state_of() { t describe "$1" -o json | sed -n 's/^ *"state": *"\([a-z_-]*\)".*/\1/p' | head -1; }

torch_ok=no
grep -q 'torch	ok' "$raw/events.tsv" && torch_ok=yes
if [[ "$mig_on" == yes ]]; then
  say "a GPU is in MIG mode: its instances are adopted as they are; the whole-GPU workloads are skipped"
  ev workloads.skipped "mig"
elif [[ "$torch_ok" != yes ]]; then
  ev workloads.skipped "torch"
else
  say "workload 1: PyTorch matrix multiplies for ${SECONDS_W1} s on a whole GPU"
  ev w1.submit
  t run --tenant devcheck --project ml --name devcheck-matmul --gpus 1 --cpus "$cpus" --memory-gib "$mem_gib" \
    --env "DEVCHECK_SECONDS=$SECONDS_W1" -o json -- "${w1[@]}" >"$raw/w1-run.json"
  id1="$(run_id "$raw/w1-run.json")"
  ev w1.id "$id1"
  if [[ -n "$id1" ]]; then
    for _ in $(seq 150); do
      s="$(state_of "$id1")"
      case "$s" in succeeded | failed | cancelled | lost) break ;; esac
      sleep 1
    done
    ev w1.ended "$s"
    say "workload 1 ended: $s; watching the telemetry fall back"
    sleep $((TELEMETRY_MS * 2 / 1000 + 3))
    t describe "$id1" -o json >"$raw/w1.json"
    t logs "$id1" >"$raw/w1.log"
    t pools -o json >"$raw/pools-after-w1.json"
  fi

  say "workload 2: cancelled while it computes (SIGTERM, SIGKILL after ${GRACE_S} s)"
  t run --tenant devcheck --project ml --name devcheck-cancel --gpus 1 --cpus "$cpus" --memory-gib "$mem_gib" \
    -o json -- "${w2[@]}" >"$raw/w2-run.json"
  id2="$(run_id "$raw/w2-run.json")"
  ev w2.id "$id2"
  if [[ -n "$id2" ]]; then
    for _ in $(seq 90); do
      t logs "$id2" 2>/dev/null | grep -q 'compute-begin' && break
      sleep 1
    done
    pgid="$(awk '{print $1}' "$data/tessera/workloads/$id2/pid" 2>/dev/null)"
    ev w2.pgid "$pgid"
    ev w2.cancel_sent
    t cancel "$id2" >>"$log"
    if [[ -n "$pgid" ]]; then
      for _ in $(seq $((GRACE_S * 10 + 150))); do
        kill -0 -- "-$pgid" 2>/dev/null || break
        sleep 0.1
      done
      if kill -0 -- "-$pgid" 2>/dev/null; then ev w2.group_alive; else ev w2.group_gone; fi
    fi
    sleep $((TELEMETRY_MS / 1000 + 2))
    t describe "$id2" -o json >"$raw/w2.json"
    t logs "$id2" >"$raw/w2.log"
  fi
fi

# 3. After: NVML (through gpu-check) and nvidia-smi again; usage as Tessera metered it.
say "reading the GPUs again"
timeout 60 "$bin" gpu-check "${fake[@]}" >"$raw/gpu-check-after.json" 2>>"$log"
query_gpus "$raw/smi-gpu-after.csv"
timeout 30 "$smi" mig -lgi >"$raw/smi-mig-lgi-after.txt" 2>&1
timeout 30 "$smi" --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,nounits >"$raw/smi-apps-after.csv" 2>>"$log"
t usage --by interval -o json >"$raw/usage-intervals.json"
t usage --by project -o json >"$raw/usage-projects.json"
t pools -o json >"$raw/pools-after.json"
ev check.end
say "collection done"
