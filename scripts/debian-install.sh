# Sourced by the scripts that install what they need from Debian (test.sh,
# kube-test-kubelet.sh).

# debian_install MESSAGE PACKAGE...: installs the Debian PACKAGEs, quietly and without
# recommends; run as another user than root, prints MESSAGE (what is missing, and that root
# installs it) and exits 1.
debian_install() {
  local message=$1
  shift
  if [ "$(id -u)" -ne 0 ]; then
    echo "$message" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
