//! The wall clock herald stamps messages with, in one place so that every module reads it the
//! same way.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock microseconds since the UNIX epoch: publishers on the same host compare it with
/// their own clock to split latency into legs.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
