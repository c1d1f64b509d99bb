//! The integration tests of `tessera-backend-local`, one test binary (as ripgrep's
//! `tests/tests.rs`): each module is one former test file, so the crate's tests link once. Run one
//! module with `cargo test -p tessera-backend-local --test integration MODULE::`.

mod contract_suite;
mod isolation;
mod local;
