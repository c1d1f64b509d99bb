//! The integration tests of `tessera-backend-sim`, one test binary (as ripgrep's
//! `tests/tests.rs`): each module is one former test file, so the crate's tests link once. Run one
//! module with `cargo test -p tessera-backend-sim --test integration MODULE::`.

mod common;

mod contract;
mod contract_suite;
mod gang;
mod partitioning;
