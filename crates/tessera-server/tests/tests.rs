//! The integration tests of `tessera-server`, one test binary (as ripgrep's `tests/tests.rs`):
//! each module is one former test file, so the crate's tests link once. Run one module with `cargo
//! test -p tessera-server --test integration MODULE::`.

mod support;

mod api;
mod console;
mod fleet_swap;
mod hardening;
mod health;
mod leadership;
mod lifecycle;
mod oidc;
mod rbac;
mod rollout;
mod tls;
