//! The control plane's clock: milliseconds since the Unix epoch, the one time base of records,
//! events and usage intervals. Everything that needs the time asks here (the pure crates are
//! given it).
//!
//! A test that pauses Tokio's clock and steps it ([`follow_tokio_clock`]) makes this clock
//! follow Tokio's: the control loop's timers, the simulated backend's and the records' times
//! then advance together, only when the test advances them, however loaded the machine is.

use std::sync::OnceLock;

/// Set by [`follow_tokio_clock`]: the wall time (in microseconds, so that readings are not a
/// truncated millisecond behind the system's) and Tokio's instant it started from.
static FOLLOWS_TOKIO: OnceLock<(i64, tokio::time::Instant)> = OnceLock::new();

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    match FOLLOWS_TOKIO.get() {
        Some((base_us, base)) => {
            (base_us + tokio::time::Instant::now().saturating_duration_since(*base).as_micros() as i64) / 1000
        }
        None => system_ms(),
    }
}

/// From now on, for the rest of the process, [`now_ms`] is the wall time of this call plus
/// the time Tokio's clock has advanced since: on a runtime whose clock is paused (called from
/// it), the time the test steps. For tests only: a server's clock must follow the system's.
pub fn follow_tokio_clock() {
    FOLLOWS_TOKIO.get_or_init(|| {
        let us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        (us, tokio::time::Instant::now())
    });
}

fn system_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
