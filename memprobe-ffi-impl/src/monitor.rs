//! The background monitor through the C ABI.

use crate::boundary::{entry_point, out};
use crate::status::memprobe_status;
use memprobe_core::monitor;
use std::time::Duration;

/// Counters of the monitor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct memprobe_monitor_stats {
    /// Whether the monitor thread runs in this process.
    pub running: bool,
    /// Sampled sources with open windows, polled at each tick.
    pub watched: u64,
    /// Polling rounds so far.
    pub ticks: u64,
    /// Successful reads by the monitor.
    pub reads: u64,
    /// Failed reads by the monitor (e.g. a GPU lost).
    pub errors: u64,
    /// Polling interval, nanoseconds.
    pub interval_ns: u64,
}

/// The shortest monitor interval accepted, nanoseconds (100 µs).
pub const MEMPROBE_MONITOR_MIN_INTERVAL_NS: u64 = 100_000;
/// The longest monitor interval accepted, nanoseconds (1 hour).
pub const MEMPROBE_MONITOR_MAX_INTERVAL_NS: u64 = 3_600_000_000_000;

/// Sets how often the monitor polls sampled sources (default 10 ms), within
/// MEMPROBE_MONITOR_MIN_INTERVAL_NS ..= MEMPROBE_MONITOR_MAX_INTERVAL_NS.
#[no_mangle]
pub extern "C" fn memprobe_monitor_set_interval_ns(interval_ns: u64) -> memprobe_status {
    entry_point("memprobe_monitor_set_interval_ns", || {
        Ok(monitor::set_interval(Duration::from_nanos(interval_ns))?)
    })
}

/// Reads the monitor's counters.
#[no_mangle]
pub extern "C" fn memprobe_monitor_get_stats(out: *mut memprobe_monitor_stats) -> memprobe_status {
    entry_point("memprobe_monitor_get_stats", || {
        let slot = self::out(out, "out")?;
        let s = monitor::stats()?;
        *slot = memprobe_monitor_stats {
            running: s.running,
            watched: s.watched as u64,
            ticks: s.ticks,
            reads: s.reads,
            errors: s.errors,
            interval_ns: u64::try_from(s.interval.as_nanos()).unwrap_or(u64::MAX),
        };
        Ok(())
    })
}

/// Stops the monitor thread and waits for it; it restarts when a window next
/// opens over a sampled source. WRONG_ORDER when called from a callback
/// running on the monitor thread.
#[no_mangle]
pub extern "C" fn memprobe_monitor_stop() -> memprobe_status {
    entry_point("memprobe_monitor_stop", || Ok(monitor::stop()?))
}
