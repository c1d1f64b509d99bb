//! The integration tests of `tessera-sched`, one test binary (as ripgrep's `tests/tests.rs`): each
//! module is one former test file, so the crate's tests link once. Run one module with `cargo test
//! -p tessera-sched --test integration MODULE::`.

mod gang_properties;
mod openb_trace;
mod properties;
mod rollout;
