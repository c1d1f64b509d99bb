//! The integration tests of `tessera-backend-kube`, one test binary (as ripgrep's
//! `tests/tests.rs`): each module is one former test file, so the crate's tests link once. Run one
//! module with `cargo test -p tessera-backend-kube --test integration MODULE::`.

mod support;

mod bench_bind;
mod cluster;
mod kubelet;
