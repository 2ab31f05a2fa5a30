//! Human-facing numbers: bytes in IEC units, durations, times of day.

use std::time::Duration;

const KIB: f64 = 1024.0;

/// `bytes` in the largest IEC unit that keeps the figure ≥ 1, with three
/// significant digits: `512 B`, `1.50 KiB`, `12.3 MiB`, `612 MiB`, `1.23 GiB`.
pub(crate) fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / KIB;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= KIB;
        unit += 1;
    }
    // Round first so 1023.96 MiB reads "1024 MiB", not "1.00e3".
    if v < 9.995 {
        format!("{v:.2} {}", UNITS[unit])
    } else if v < 99.95 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

/// An optional byte count, `-` when absent.
pub(crate) fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), bytes)
}

/// Seconds as `0.42 s`, `12.3 s`, `5 min 03 s`, `2 h 05 min`.
pub(crate) fn secs(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        let whole = s.round() as u64;
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        let whole = (s / 60.0).round() as u64;
        format!("{} h {:02} min", whole / 60, whole % 60)
    }
}

/// A short duration as written on the command line: `10ms`, `1s`, `500us`.
pub(crate) fn duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0s".into()
    } else if ns % 1_000_000_000 == 0 {
        format!("{}s", ns / 1_000_000_000)
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1_000 == 0 {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// Seconds since the Unix epoch, as f64.
pub(crate) fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The local wall-clock time of day `HH:MM:SS` for `unix_s`.
pub(crate) fn time_of_day(unix_s: f64) -> String {
    let t = unix_s as libc::time_t;
    // SAFETY: `tm` is a plain C struct for which all-zero is valid; localtime_r
    // only writes into it and reads `t`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if ok {
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    } else {
        format!("{unix_s:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iec() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(256 << 20), "256 MiB");
        assert_eq!(bytes(12_900_000), "12.3 MiB");
        assert_eq!(bytes((1 << 30) + (1 << 29)), "1.50 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(opt_bytes(None), "-");
    }

    #[test]
    fn times() {
        assert_eq!(secs(0.421), "0.42 s");
        assert_eq!(secs(12.34), "12.3 s");
        assert_eq!(secs(303.0), "5 min 03 s");
        assert_eq!(secs(7500.0), "2 h 05 min");
        assert_eq!(duration(Duration::from_millis(10)), "10ms");
        assert_eq!(duration(Duration::from_secs(2)), "2s");
        assert_eq!(duration(Duration::from_micros(500)), "500us");
    }
}
