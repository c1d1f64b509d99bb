//! The integration tests of `tessera`, one test binary (as ripgrep's `tests/tests.rs`): each
//! module is one former test file, so the crate's tests link once. Run one module with `cargo test
//! -p tessera --test integration MODULE::`.

#[path = "../../tessera-backend-kube/tests/support/mod.rs"]
mod kube_support;
mod support;

mod cli;
mod console;
mod ha;
mod kube_admission;
mod kube_backend;
mod kube_nodes;
mod local_backend;
mod metrics;
mod plan;
mod prometheus;
mod restart;
mod rollout;
mod sso_login;
