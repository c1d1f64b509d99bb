#!/usr/bin/env bash
# The node half of the kube backend's test cluster: a kubelet built from the same Debian source
# tree as the control plane (scripts/kube-test-cluster.sh, which calls this script), Debian's
# containerd, runc, CNI plugins and busybox-static, and a tiny OCI image archive made locally
# around /bin/busybox, so pods run without any registry. Everything is cached beside the control
# plane's binaries, keyed the same way:
#
#   <cache>/kubernetes-<debian version>/bin/kubelet
#   <cache>/kubernetes-<debian version>/bin/tessera-test-images.oci.tar
#       tessera.test/busybox:1  (busybox and its applets in /bin; for workloads)
#       tessera.test/pause:1    (the same layer, `sleep` as its entrypoint; the CRI sandbox image)
#
# Usage: scripts/kube-test-kubelet.sh <cache>/kubernetes-<version> <upstream version, 1.20.2>
# Needs the work tree kube-test-cluster.sh leaves under <dir>/work (source, Go, Go build cache):
# with a warm cache the kubelet builds in about 40 s on 2 cores. Run as root it installs the
# Debian packages that are missing. The tests (crates/tessera-backend-kube/tests/kubelet.rs)
# start containerd and the kubelet themselves (tests/support/kubelet-node.sh).
set -euo pipefail
# shellcheck source=scripts/kube-version.sh
. "$(dirname "$0")/kube-version.sh"
# shellcheck source=scripts/debian-install.sh
. "$(dirname "$0")/debian-install.sh"

dir=${1:?usage: kube-test-kubelet.sh DIR UPSTREAM_VERSION}
upver=${2:?usage: kube-test-kubelet.sh DIR UPSTREAM_VERSION}
bin="$dir/bin"
work="$dir/work"
mkdir -p "$bin"

# ---- Debian packages -------------------------------------------------------------------------
pkgs=()
command -v containerd >/dev/null 2>&1 || pkgs+=(containerd)
command -v runc >/dev/null 2>&1 || pkgs+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || pkgs+=(containernetworking-plugins)
[ -x /bin/busybox ] || pkgs+=(busybox-static)
command -v nsenter >/dev/null 2>&1 || pkgs+=(util-linux)
command -v ip >/dev/null 2>&1 || pkgs+=(iproute2)
if [ ${#pkgs[@]} -gt 0 ]; then
  debian_install "kube-test-kubelet: missing ${pkgs[*]}: run this script as root to install them from Debian" "${pkgs[@]}"
  # The package may enable a system containerd: the tests run their own (private root, state
  # and socket) and never talk to it.
  systemctl disable --now containerd >/dev/null 2>&1 || true
fi

# ---- kubelet ----------------------------------------------------------------------------------
if [ -x "$bin/kubelet" ]; then
  echo "kube-test-kubelet: cached kubelet ($("$bin/kubelet" --version))"
else
  src="$work/src/kubernetes"
  [ -f "$src/.tessera-extracted" ] || { echo "kube-test-kubelet: no source tree under $work: run scripts/kube-test-cluster.sh" >&2; exit 1; }
  gobin=$(find "$work/venv" -path '*site-packages/go/bin/go' -type f | head -1)
  [ -x "$gobin" ] || { echo "kube-test-kubelet: no go under $work/venv: run scripts/kube-test-cluster.sh" >&2; exit 1; }
  export GOPATH="$work/gopath" GOCACHE="$work/gocache" GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
    GOFLAGS= CGO_ENABLED=0
  mkdir -p "$GOPATH/src/k8s.io"
  ln -sfn "$src" "$GOPATH/src/k8s.io/kubernetes"
  cd "$GOPATH/src/k8s.io/kubernetes"
  ld=$(kube_ldflags "$upver")
  t0=$(date +%s)
  mkdir -p "$work/out"
  "$gobin" build -p 1 -tags selinux,notest -ldflags "-s -w $ld" -o "$work/out/kubelet" ./cmd/kubelet
  mv "$work/out/kubelet" "$bin/kubelet"
  echo "kube-test-kubelet: kubelet built in $(( $(date +%s) - t0 )) s ($("$bin/kubelet" --version))"
fi

# ---- the test images (an OCI image layout archive, no registry) ---------------------------------
images="$bin/tessera-test-images.oci.tar"
stamp="busybox-static $(dpkg-query -W -f '${Version}' busybox-static 2>/dev/null || echo unknown)"
if [ ! -s "$images" ] || [ "$(cat "$images.version" 2>/dev/null)" != "$stamp" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/rootfs/bin" "$tmp/rootfs/tmp" "$tmp/rootfs/etc" "$tmp/rootfs/proc" "$tmp/rootfs/sys" \
    "$tmp/rootfs/dev" "$tmp/oci/blobs/sha256"
  cp /bin/busybox "$tmp/rootfs/bin/busybox"
  for a in $(/bin/busybox --list); do
    [ "$a" = busybox ] || ln -s busybox "$tmp/rootfs/bin/$a"
  done
  chmod 1777 "$tmp/rootfs/tmp"
  # Reproducible: sorted names, owner root, time 0.
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$tmp/layer.tar" -C "$tmp/rootfs" .
  blob() { # FILE -> prints "sha256:<hex> <size>" and stores the file as a blob
    local h s
    h=$(sha256sum "$1" | cut -d' ' -f1)
    s=$(stat -c %s "$1")
    cp "$1" "$tmp/oci/blobs/sha256/$h"
    echo "sha256:$h $s"
  }
  read -r layer_digest layer_size < <(blob "$tmp/layer.tar")
  manifests=""
  for img in busybox pause; do
    case $img in
      busybox) cfg_cmd='"Cmd":["sh"]' ;;
      pause) cfg_cmd='"Entrypoint":["/bin/sleep","2147483647"]' ;;
    esac
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
      "$cfg_cmd" "$layer_digest" >"$tmp/config-$img.json"
    read -r cfg_digest cfg_size < <(blob "$tmp/config-$img.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
      "$cfg_digest" "$cfg_size" "$layer_digest" "$layer_size" >"$tmp/manifest-$img.json"
    read -r m_digest m_size < <(blob "$tmp/manifest-$img.json")
    ref="tessera.test/$img:1"
    manifests="$manifests${manifests:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"$m_digest\",\"size\":$m_size,\"annotations\":{\"org.opencontainers.image.ref.name\":\"$ref\",\"io.containerd.image.name\":\"$ref\"},\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"}}"
  done
  printf '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "$manifests" >"$tmp/oci/index.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$images.part" -C "$tmp/oci" oci-layout index.json blobs
  mv "$images.part" "$images"
  echo "$stamp" >"$images.version"
  echo "kube-test-kubelet: test images tessera.test/busybox:1 and tessera.test/pause:1 in $images ($(stat -c %s "$images") bytes)"
fi
