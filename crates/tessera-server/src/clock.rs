//! The control plane's clock: milliseconds since the Unix epoch, the one time base of records,
//! events and usage intervals. Everything that needs the time asks here (the pure crates are
//! given it).

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
