//! Sampling intervals written with a unit: `10ms`, `1s`, `500us`, `0.5s`.

use std::time::Duration;

/// The shortest interval `--interval` accepts.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// The longest interval `--interval` accepts.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// Parses a duration with a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`), no unit
/// being an error: a bare `10` could mean anything.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("'{text}' has no unit: write e.g. 10ms, 1s or 500us"))?;
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a number followed by a unit"))?;
    let ns_per_unit = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{text}': use ns, us, ms, s or m"
            ))
        }
    };
    let ns = (value * ns_per_unit).round();
    if !ns.is_finite() || ns > u64::MAX as f64 {
        return Err(format!("'{text}' is too long"));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// Parses and validates a sampling interval: [`MIN_INTERVAL`] ..= [`MAX_INTERVAL`].
pub(crate) fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(format!(
            "{} is outside the accepted range 1ms ..= 60s",
            crate::units::duration(d)
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
        assert!(parse_interval("500us").unwrap_err().contains("outside"));
        assert!(parse_interval("61s").unwrap_err().contains("outside"));
        assert!(parse_interval("0ms").is_err());
    }
}
