#!/usr/bin/env bash
# One real Kubernetes node for the tests (tests/support/kubelet.rs starts it once per test
# binary): containerd (Debian's, with a private root, state directory and socket, the CRI plugin,
# the cgroupfs driver, runc behind a wrapper) and a kubelet built by scripts/kube-test-kubelet.sh,
# registered with the test API server. Runs as root. Prints `NODE_IP=<address>` and then `READY`
# on stdout once both run; then waits until its stdin closes (the test binary exited, however it
# ended) or it gets SIGINT/SIGTERM, and removes everything it made: processes, mounts, the
# network namespace and its veth pair, cgroups, CNI state, pod log directories, kernel settings.
#
# The network, so that nothing but loopback and one veth pair carries traffic:
#
#   host namespace                                | namespace tessera-kl-<id> (ip netns add)
#     kube-apiserver   127.0.0.1:<port>           |   containerd (joins only this network
#     kubelet (--node-ip = H, API on H:<port>)    |     namespace, through nsenter --net)
#     veth <host end> H = 10.213.a.b/30  <------> |   veth <netns end> N = H+1
#                                                 |   CNI bridge tkbr0 10.244.0.1/24 (host-local)
#                                                 |     pod network namespaces 10.244.0.x
#
# The kubelet runs in the host namespace, so it reaches the API server on loopback and talks to
# containerd through its unix socket. The kubelet refuses a loopback --node-ip: the node's address
# is H, the veth's own host end, where the kubelet's API listens (the API server reaches it there
# for logs and exec). containerd runs in the test's network namespace, so the CNI plugins it calls
# put their bridge and the pods' veths there, never in the host namespace; its streaming server
# (exec, attach) listens on N. No default route leaves that namespace.
#
# Environment: DIR (an empty private directory), BIN (kubelet, kubectl), IMAGES (the OCI archive),
# NODE (the node's name), KUBECONFIG (the kubelet's, a node identity), KUBELET_PORT, NODE_LABELS
# (k=v,...).
set -uo pipefail

: "${DIR:?}" "${BIN:?}" "${IMAGES:?}" "${NODE:?}" "${KUBECONFIG:?}" "${KUBELET_PORT:?}" "${NODE_LABELS:=}"
id=$$
ns="tessera-kl-$id"
vh="tkl${id}h"
vn="tkl${id}n"
cg="tessera-kubelet-$id"
net="tessera-kl-$id"
log() { echo "kubelet-node: $*" >&2; }

# ---- teardown ---------------------------------------------------------------------------------
sysctls="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
declare -A saved=()
for k in $sysctls; do saved[$k]=$(sysctl -n "$k" 2>/dev/null || true); done
pids=()
cleaned=0
cg_dirs() { for h in /sys/fs/cgroup/*/; do [ -d "$h$cg" ] && echo "$h$cg"; done; }
cg_procs() { for d in $(cg_dirs); do find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null; done | sort -u; }
teardown() {
  [ "$cleaned" = 1 ] && return
  cleaned=1
  trap '' INT TERM
  # The kubelet first (it would restart what is killed), then containerd, then everything left
  # in this node's cgroups (shims, pod processes).
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for _ in $(seq 1 50); do
    left=$(cg_procs)
    [ -z "$left" ] && break
    for p in $left; do [ "$p" != "$$" ] && kill -KILL "$p" 2>/dev/null; done
    sleep 0.1
  done
  # Pod log directories of this node's pods (the kubelet writes them under /var/log/pods and
  # removes a deleted pod's only a minute later): every pod this containerd made a sandbox for.
  uids=$( { ls "$DIR/kubelet/pods" 2>/dev/null
    grep -o 'PodSandboxMetadata{Name:[^,]*,Uid:[0-9a-f-]*' "$DIR/containerd.log" 2>/dev/null | sed 's/.*Uid://'
  } | grep -E '^[0-9a-f-]{36}$' | sort -u)
  for uid in $uids; do
    for l in /var/log/containers/*.log; do
      [ -L "$l" ] && case "$(readlink "$l")" in /var/log/pods/*_"$uid"/*) rm -f "$l" ;; esac
    done
    rm -rf /var/log/pods/*_"$uid"
  done
  # Mounts under the private directory (container root filesystems, sandbox /dev/shm, pod
  # network namespaces, kubelet volumes), deepest first.
  for _ in 1 2 3; do
    mps=$(awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    [ -z "$mps" ] && break
    for m in $mps; do umount -l "$m" 2>/dev/null; done
  done
  ip netns del "$ns" 2>/dev/null
  ip link del "$vh" 2>/dev/null
  rm -f /var/lib/cni/results/"$net"-* 2>/dev/null
  for _ in 1 2 3 4 5; do
    rest=0
    for d in $(cg_dirs); do
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
      [ -d "$d" ] && rest=1
    done
    [ $rest = 0 ] && break
    sleep 0.2
  done
  for k in $sysctls; do
    [ -n "${saved[$k]}" ] && [ "$(sysctl -n "$k" 2>/dev/null)" != "${saved[$k]}" ] && sysctl -qw "$k=${saved[$k]}"
  done
  rm -rf "$DIR"
  log "cleaned up"
}
trap 'teardown; exit 0' INT TERM
trap teardown EXIT

fail() { log "$*"; exit 1; }

# ---- leftovers of a node whose teardown never ran (killed with SIGKILL) --------------------------
for f in /run/netns/tessera-kl-*; do
  [ -e "$f" ] || continue
  p=${f##*-}
  kill -0 "$p" 2>/dev/null || ip netns del "tessera-kl-$p" 2>/dev/null
done
for d in /sys/fs/cgroup/*/tessera-kubelet-*; do
  [ -d "$d" ] || continue
  p=${d##*-}
  kill -0 "$p" 2>/dev/null && continue
  for q in $(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null); do kill -KILL "$q" 2>/dev/null; done
  find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
done

# ---- network ----------------------------------------------------------------------------------
# A /30 for the veth pair, from this process's ID, skipping any already on an interface.
host_ip=""
for try in $(seq 0 63); do
  n=$(( (id + try * 977) % 16384 ))
  a=$(( n / 64 )); b=$(( (n % 64) * 4 ))
  cand="10.213.$a.$((b + 1))"
  ip -o addr | grep -q " 10\.213\.$a\.$((b + 1))/\| 10\.213\.$a\.$((b + 2))/" && continue
  host_ip=$cand
  ns_ip="10.213.$a.$((b + 2))"
  break
done
[ -n "$host_ip" ] || fail "no free /30 under 10.213.0.0/16"
ip netns add "$ns" || fail "ip netns add $ns"
ip link add "$vh" type veth peer name "$vn" || fail "ip link add $vh"
ip link set "$vn" netns "$ns"
ip addr add "$host_ip/30" dev "$vh"
ip link set "$vh" up
ip -n "$ns" addr add "$ns_ip/30" dev "$vn"
ip -n "$ns" link set "$vn" up
ip -n "$ns" link set lo up
echo "NODE_IP=$host_ip"

# ---- cgroups: one tree for this node in every v1 hierarchy; the kubelet's --cgroup-root ------
for h in /sys/fs/cgroup/*/; do
  case "$h" in */unified/) continue ;; esac
  mkdir -p "$h$cg" "$h$cg/daemons" || fail "mkdir $h$cg"
done
if [ -d /sys/fs/cgroup/cpuset/$cg ]; then
  for f in cpuset.cpus cpuset.mems; do
    cat /sys/fs/cgroup/cpuset/$f >/sys/fs/cgroup/cpuset/$cg/$f
    cat /sys/fs/cgroup/cpuset/$f >/sys/fs/cgroup/cpuset/$cg/daemons/$f
  done
fi
# Starts a daemon inside this node's cgroups (so teardown finds its children, too).
in_cgroup() { # LOG CMD... -> pid
  local logf=$1
  shift
  (
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h$cg/daemons" ] && echo "$BASHPID" >"$h$cg/daemons/cgroup.procs" 2>/dev/null
    done
    exec "$@"
  ) </dev/null >"$logf" 2>&1 &
  pids+=($!)
}

# ---- containerd -------------------------------------------------------------------------------
mkdir -p "$DIR/containerd/root" "$DIR/containerd/state" "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/kubelet"
sock="$DIR/containerd/containerd.sock"
runc_bin=$(command -v runc) || fail "no runc"
# The sandbox asks for oomScoreAdj -998; without CAP_SYS_RESOURCE (these VMs) runc cannot set a
# negative score and every sandbox fails ("can't get final child's PID from pipe: EOF").
cat >"$DIR/runc-wrapper" <<EOF
#!/bin/sh
bundle=
prev=
for a in "\$@"; do
  case "\$prev" in --bundle|-b) bundle=\$a ;; esac
  case "\$a" in --bundle=*) bundle=\${a#--bundle=} ;; esac
  prev=\$a
done
if [ -n "\$bundle" ] && [ -f "\$bundle/config.json" ]; then
  sed -i -E 's/"oomScoreAdj": *-[0-9]+/"oomScoreAdj":0/' "\$bundle/config.json"
fi
exec $runc_bin "\$@"
EOF
chmod +x "$DIR/runc-wrapper"
cat >"$DIR/cni/net.d/10-tessera.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "$net", "plugins": [
  {"type": "bridge", "bridge": "tkbr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "dataDir": "$DIR/cni/ipam"}}
]}
EOF
cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = "$DIR/containerd/debug.sock"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "tessera.test/pause:1"
  stream_server_address = "$ns_ip"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$DIR/runc-wrapper"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
EOF
in_cgroup "$DIR/containerd.log" nsenter --net="/run/netns/$ns" containerd --config "$DIR/containerd/config.toml"
ctr() { command ctr --address "$sock" "$@"; }
for _ in $(seq 1 100); do
  ctr version >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "containerd exited: $(tail -5 "$DIR/containerd.log")"
  sleep 0.1
done
ctr version >/dev/null 2>&1 || fail "containerd did not answer in 10 s: $(tail -5 "$DIR/containerd.log")"
ctr -n k8s.io images import "$IMAGES" >"$DIR/import.log" 2>&1 || fail "image import: $(cat "$DIR/import.log")"

# ---- kubelet ----------------------------------------------------------------------------------
cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $host_ip
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$cg
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
makeIPTablesUtilChains: false
serializeImagePulls: false
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
syncFrequency: 10s
fileCheckFrequency: 20s
nodeStatusUpdateFrequency: 5s
imageMinimumGCAge: 24h
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
containerLogMaxSize: 1Mi
runtimeRequestTimeout: 2m
EOF
in_cgroup "$DIR/kubelet.log" "$BIN/kubelet" --config "$DIR/kubelet.yaml" --kubeconfig "$KUBECONFIG" \
  --container-runtime=remote --container-runtime-endpoint="unix://$sock" \
  --image-service-endpoint="unix://$sock" \
  --pod-infra-container-image=tessera.test/pause:1 \
  --root-dir "$DIR/kubelet" --cert-dir "$DIR/kubelet/pki" \
  --hostname-override "$NODE" --node-ip "$host_ip" --node-labels "$NODE_LABELS" \
  --logtostderr=true --v=1
sleep 1
kill -0 "${pids[1]}" 2>/dev/null || fail "kubelet exited: $(tail -5 "$DIR/kubelet.log")"
echo READY

# ---- wait for the test binary ------------------------------------------------------------------
while read -r _; do :; done
# stdin closed: the test binary is gone.
teardown
