#!/usr/bin/env bash
# Runs every Tessera test on a fresh Debian machine, installing what the tests need.
# Usage: scripts/test.sh        (from the repository root; CI calls it through .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never
export CARGO_INCREMENTAL=0

echo "== toolchain"
cargo --version
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== format"
cargo fmt --all -- --check

echo "== lint"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== tests"
cargo test --workspace
