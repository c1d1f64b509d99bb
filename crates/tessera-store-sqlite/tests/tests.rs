//! The integration tests of `tessera-store-sqlite`, one test binary (as ripgrep's
//! `tests/tests.rs`): each module is one former test file, so the crate's tests link once
//! (batch.rs, a measurement, has its own: see Cargo.toml). Run one module with `cargo test -p
//! tessera-store-sqlite --test integration MODULE::`.

mod conformance;
mod legacy;
mod sqlite;
