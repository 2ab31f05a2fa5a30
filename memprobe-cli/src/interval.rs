//! Sampling intervals written with a unit: `10ms`, `1s`, `500us`, `0.5s`.

use std::time::Duration;

/// The shortest interval `--interval` accepts: the core monitor's (every
/// example the messages give, `500us` among them, is accepted).
pub(crate) const MIN_INTERVAL: Duration = memprobe_core::monitor::MIN_INTERVAL;
/// The longest interval `--interval` accepts.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// The accepted range as the messages write it.
const RANGE: &str = "100us ..= 60s";
/// How to write an interval, in every error message.
const ACCEPTED: &str = "write a duration of 100us ..= 60s with a unit, e.g. 10ms, 1s or 500us";

/// Parses a duration with a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`), no unit
/// being an error: a bare `10` could mean anything (a bare `0` is no
/// duration either way, and is reported by [`parse_interval`] as out of range).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("'{text}' has no unit: {ACCEPTED}"))?;
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a number followed by a unit: {ACCEPTED}"))?;
    let ns_per_unit = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{text}' (units: ns, us, ms, s, m): {ACCEPTED}"
            ))
        }
    };
    let ns = (value * ns_per_unit).round();
    if !ns.is_finite() || ns > u64::MAX as f64 {
        return Err(format!("'{text}' is too long: {ACCEPTED}"));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// Parses and validates a sampling interval: [`MIN_INTERVAL`] ..= [`MAX_INTERVAL`].
/// Zero, with a unit or without, gets the one out-of-range message.
pub(crate) fn parse_interval(text: &str) -> Result<Duration, String> {
    let zero = {
        let t = text.trim();
        let number = t.trim_end_matches(|c: char| !(c.is_ascii_digit() || c == '.'));
        !number.is_empty() && number.parse::<f64>().is_ok_and(|v| v == 0.0)
    };
    let d = if zero {
        Duration::ZERO
    } else {
        parse_duration(text)?
    };
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(format!(
            "'{}' is outside the accepted range {RANGE}: write it with a unit, e.g. 10ms, 1s or 500us",
            text.trim()
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("500µs"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2.5ms"), Ok(Duration::from_micros(2500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("10 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1.2.3s").is_err());
    }

    #[test]
    fn range() {
        assert_eq!(parse_interval("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_interval("60s"), Ok(Duration::from_secs(60)));
        // Every example the messages give is accepted.
        assert_eq!(parse_interval("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_interval("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_interval("100000ns"), Ok(Duration::from_micros(100)));
        assert!(parse_interval("99us").unwrap_err().contains("outside"));
        for example in ["10ms", "1s", "500us", "0.5s", "1m", "500µs"] {
            assert!(parse_interval(example).is_ok(), "{example}");
        }
        assert_eq!(MIN_INTERVAL, Duration::from_micros(100), "{RANGE}");
        assert!(parse_interval("61s").unwrap_err().contains("outside"));
        assert!(parse_interval("0ms").is_err());
        // Zero, however written, gets one message with the range and an example.
        let zero = parse_interval("0").unwrap_err();
        assert_eq!(
            zero,
            "'0' is outside the accepted range 100us ..= 60s: write it with a unit, e.g. 10ms, 1s or 500us"
        );
        for z in ["0ms", "0s", "0.0", " 0 "] {
            let e = parse_interval(z).unwrap_err();
            assert_eq!(e.replace(&format!("'{}'", z.trim()), "'0'"), zero, "{z}");
        }
        assert!(parse_interval("10").unwrap_err().contains("100us ..= 60s"));
    }
}
