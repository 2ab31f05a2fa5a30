//! Human-facing numbers: the core's (memprobe-core's `units`), so the
//! command and the library's summaries print one text per number; counts
//! with their noun; and the wall clock the command's reports are stamped
//! with.

pub(crate) use memprobe_core::internal::units::{bytes, duration, opt_bytes, secs, time_of_day};

/// `1 step`, `3 steps`.
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Seconds since the Unix epoch, as f64.
pub(crate) fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
