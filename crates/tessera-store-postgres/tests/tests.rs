//! The integration tests of `tessera-store-postgres`, one test binary (as ripgrep's
//! `tests/tests.rs`): each module is one former test file, so the crate's tests link once. Run one
//! module with `cargo test -p tessera-store-postgres --test integration MODULE::`.

mod conformance;
mod postgres;
