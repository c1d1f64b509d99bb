# Sourced by kube-test-cluster.sh and kube-test-kubelet.sh: the version stamp of the Kubernetes
# binaries they build from the Debian source tree, so that the control plane and the kubelet
# report the same upstream version.

# kube_ldflags VERSION: the linker's -X flags that stamp a binary with upstream VERSION (1.20.2).
kube_ldflags() {
  local v=$1 major minor ld="" p
  major=${v%%.*}
  minor=$(echo "$v" | cut -d. -f2)
  for p in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "$ld"
}
