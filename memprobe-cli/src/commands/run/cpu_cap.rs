//! `--max-cpu PCT`: memprobe's own CPU held under a share of one core by
//! widening the sampling interval, and narrowing it back (never below the
//! interval asked for) when the cost falls.
//!
//! Every [`WINDOW`] the sampler compares memprobe's CPU time over the window
//! (`getrusage(RUSAGE_SELF)`: every thread of memprobe, the command's not
//! included) with the cap. Above it, the interval grows by the overshoot
//! and a margin; well below it, it halves. The cost of a tick is close to
//! proportional to the number of ticks, so one step usually settles it.

use serde::Serialize;
use std::time::{Duration, Instant};

/// How often the interval is reconsidered.
const WINDOW: Duration = Duration::from_millis(500);
/// The widest interval the cap may choose (the widest `--interval`).
const WIDEST: Duration = Duration::from_secs(60);
/// Aim this far below the cap, so that noise does not cross it.
const MARGIN: f64 = 1.25;

/// What the cap did over the run (the JSON's `cpu_cap`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CpuCapReport {
    /// The cap, percent of one core.
    pub(crate) max_cpu_percent: f64,
    /// The widest interval used, seconds (`interval_s` when never widened).
    pub(crate) widest_interval_s: f64,
    /// The interval at the end of the run, seconds.
    pub(crate) last_interval_s: f64,
    /// Times the interval was widened.
    pub(crate) widenings: u32,
    /// Times it was narrowed back.
    pub(crate) narrowings: u32,
}

/// The cap's state while sampling.
#[derive(Debug)]
pub(crate) struct CpuCap {
    max_pct: f64,
    base: Duration,
    current: Duration,
    widest: Duration,
    widenings: u32,
    narrowings: u32,
    since: Instant,
    cpu_since: f64,
}

impl CpuCap {
    /// A cap of `max_pct` percent of one core over sampling every `base`.
    pub(crate) fn new(max_pct: f64, base: Duration) -> CpuCap {
        CpuCap {
            max_pct,
            base,
            current: base,
            widest: base,
            widenings: 0,
            narrowings: 0,
            since: Instant::now(),
            cpu_since: own_cpu_s(),
        }
    }

    /// After a tick at `now`: the interval until the next one.
    pub(crate) fn after_tick(&mut self, now: Instant) -> Duration {
        let wall = now.duration_since(self.since);
        if wall < WINDOW.max(self.current * 5) {
            return self.current;
        }
        let cpu = own_cpu_s();
        let used = (cpu - self.cpu_since) / wall.as_secs_f64() * 100.0;
        (self.since, self.cpu_since) = (now, cpu);
        self.adjust(used);
        self.current
    }

    /// Folds in one window's use, percent of one core.
    fn adjust(&mut self, used: f64) {
        if used > self.max_pct {
            let factor = (used / self.max_pct * MARGIN).max(1.5);
            let wider = self.current.mul_f64(factor).min(WIDEST);
            if wider > self.current {
                self.current = wider;
                self.widest = self.widest.max(wider);
                self.widenings += 1;
            }
        } else if self.current > self.base {
            // Halving doubles the cost: only where that stays clear of the cap.
            let narrower = (self.current / 2).max(self.base);
            let predicted = used * self.current.as_secs_f64() / narrower.as_secs_f64();
            if predicted * MARGIN < self.max_pct {
                self.current = narrower;
                self.narrowings += 1;
            }
        }
    }

    /// What the cap did.
    pub(crate) fn report(&self) -> CpuCapReport {
        CpuCapReport {
            max_cpu_percent: self.max_pct,
            widest_interval_s: self.widest.as_secs_f64(),
            last_interval_s: self.current.as_secs_f64(),
            widenings: self.widenings,
            narrowings: self.narrowings,
        }
    }
}

/// memprobe's CPU time so far (every thread), seconds.
fn own_cpu_s() -> f64 {
    crate::commands::run::child::own_cpu_s()
}

/// Parses `--max-cpu`: a percentage of one core, `1%` or `1`, in
/// (0, 100].
pub(crate) fn parse_max_cpu(s: &str) -> Result<f64, String> {
    let n = s.trim().strip_suffix('%').unwrap_or(s.trim());
    let v: f64 = n
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage of one core (e.g. 1% or 0.5)"))?;
    if v.is_finite() && v > 0.0 && v <= 100.0 {
        Ok(v)
    } else {
        Err(format!(
            "{s:?}: the share of one core must be above 0 and at most 100"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widens_by_the_overshoot_and_narrows_back_to_the_base() {
        let base = Duration::from_millis(10);
        let mut c = CpuCap::new(1.0, base);
        c.adjust(4.0);
        assert_eq!(c.current, Duration::from_millis(50), "4x over, with margin");
        c.adjust(0.9);
        assert_eq!(c.current, Duration::from_millis(50), "doubling would cross");
        c.adjust(0.3);
        assert_eq!(c.current, Duration::from_millis(25));
        c.adjust(0.2);
        c.adjust(0.1);
        assert_eq!(c.current, base, "never below the interval asked for");
        let r = c.report();
        assert_eq!((r.widenings, r.narrowings), (1, 3), "50, 25, 12.5, 10 ms");
        assert!((r.widest_interval_s - 0.05).abs() < 1e-9);
        assert!((r.last_interval_s - 0.01).abs() < 1e-9);
    }

    #[test]
    fn a_small_overshoot_still_widens_and_never_past_a_minute() {
        let mut c = CpuCap::new(1.0, Duration::from_secs(30));
        c.adjust(1.01);
        assert_eq!(c.current, Duration::from_secs(45));
        c.adjust(100.0);
        assert_eq!(c.current, WIDEST);
        c.adjust(100.0);
        assert_eq!(c.report().widenings, 2, "no widening past the widest");
    }

    #[test]
    fn parses_percentages() {
        assert_eq!(parse_max_cpu("1%"), Ok(1.0));
        assert_eq!(parse_max_cpu("0.5"), Ok(0.5));
        assert_eq!(parse_max_cpu(" 100 % "), Ok(100.0));
        for bad in ["0", "0%", "-1", "101", "abc", "nan", "inf", ""] {
            assert!(parse_max_cpu(bad).is_err(), "{bad}");
        }
    }
}
