//! Numbers for people: bytes in IEC units, durations, dates and times of
//! day. The workspace's one text for each: the core's summaries and the
//! `memprobe` command print the same number the same way.

use std::time::Duration;

const KIB: f64 = 1024.0;

/// `bytes` in the largest IEC unit that keeps the figure ≥ 1, with three
/// significant digits: `512 B`, `1.50 KiB`, `12.3 MiB`, `612 MiB`, `1.23 GiB`.
pub fn bytes(bytes: u64) -> String {
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
pub fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), bytes)
}

/// Seconds as `0.42 s`, `12.3 s`, `5 min 03 s`, `2 h 05 min`; `-` when not
/// a time (negative, NaN, infinite).
pub fn secs(s: f64) -> String {
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

/// [`secs`] of a span in nanoseconds.
pub fn secs_ns(ns: u64) -> String {
    secs(ns as f64 / 1e9)
}

/// A short duration as written on the command line: `10ms`, `1s`, `500us`.
pub fn duration(d: Duration) -> String {
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

/// `YYYY-MM-DDTHH:MM:SS.mmm` of Unix nanoseconds (UTC, proleptic
/// Gregorian): computed, not asked of the C library (no time-zone file
/// read, no lock taken), so a report built on any thread can use it.
pub fn utc(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let millis = (unix_ns / 1_000_000) % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The local wall-clock time of day `HH:MM:SS` for `unix_s` (the seconds
/// themselves when the C library cannot say).
pub fn time_of_day(unix_s: f64) -> String {
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
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(3 << 20), "3.00 MiB");
        assert_eq!(bytes(256 << 20), "256 MiB");
        assert_eq!(bytes(12_900_000), "12.3 MiB");
        assert_eq!(bytes((1 << 30) + (1 << 29)), "1.50 GiB");
        assert_eq!(bytes((1 << 30) - 1), "1024 MiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(opt_bytes(None), "-");
    }

    #[test]
    fn times() {
        assert_eq!(secs(0.421), "0.42 s");
        assert_eq!(secs(12.34), "12.3 s");
        assert_eq!(secs(303.0), "5 min 03 s");
        assert_eq!(secs(7500.0), "2 h 05 min");
        assert_eq!(secs(-1.0), "-");
        assert_eq!(secs_ns(1_500_000_000), "1.50 s");
        assert_eq!(duration(Duration::from_millis(10)), "10ms");
        assert_eq!(duration(Duration::from_secs(2)), "2s");
        assert_eq!(duration(Duration::from_micros(500)), "500us");
    }

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000");
        assert_eq!(utc(951_782_400_123_000_000), "2000-02-29T00:00:00.123");
        assert_eq!(utc(1_718_000_000_000_000_000), "2024-06-10T06:13:20.000");
    }
}
