//! Human-facing numbers: the core's ([`memprobe_core::units`]), so the
//! command and the library's summaries print one text per number; and the
//! wall clock the command's reports are stamped with.

pub(crate) use memprobe_core::internal::units::{bytes, duration, opt_bytes, secs, time_of_day};

/// Seconds since the Unix epoch, as f64.
pub(crate) fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
