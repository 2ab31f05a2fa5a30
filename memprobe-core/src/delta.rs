//! fastai's definitions of *delta used* and *delta peaked*, and the
//! per-source record of a measured interval.

use crate::sample::{PeakFidelity, SourceKind};

/// *delta used* and *delta peaked* (fastai's GPUMemTrace rule), in bytes.
///
/// - delta used = `end - start` (negative when memory was released);
/// - delta peaked = `max(0, peak - start)`, minus delta used when delta used
///   is positive: the size of the temporary blip above the net growth.
pub fn deltas(start: u64, end: u64, peak: u64) -> (i64, u64) {
    let used = i128::from(end) - i128::from(start);
    let mut peaked = i128::from(peak) - i128::from(start);
    if peaked < 0 {
        peaked = 0;
    } else if used > 0 {
        peaked -= used;
    }
    let clamp_i64 = |v: i128| v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    (
        clamp_i64(used),
        u64::try_from(peaked.max(0)).unwrap_or(u64::MAX),
    )
}

/// What one source did over one measured interval (a window, trace or phase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceDelta {
    /// The source's name.
    pub name: String,
    /// What the source measures.
    pub kind: SourceKind,
    /// How exact `peak` is.
    pub fidelity: PeakFidelity,
    /// Used at the start of the interval, bytes.
    pub used_start: u64,
    /// Used at the end (or now, for an interval still open), bytes.
    pub used_end: u64,
    /// The highest `used` over the interval, bytes (Avalanche's Max*).
    pub peak: u64,
    /// `used_end - used_start`, bytes.
    pub delta_used: i64,
    /// fastai's delta peaked, bytes (see [`deltas`]).
    pub delta_peaked: u64,
}

impl SourceDelta {
    /// Builds the record, computing the two deltas. `peak` is raised to at
    /// least `used_start` and `used_end`, which are themselves readings.
    pub fn new(
        name: &str,
        kind: SourceKind,
        fidelity: PeakFidelity,
        used_start: u64,
        used_end: u64,
        peak: u64,
    ) -> Self {
        let peak = peak.max(used_start).max(used_end);
        let (delta_used, delta_peaked) = deltas(used_start, used_end, peak);
        SourceDelta {
            name: name.to_owned(),
            kind,
            fidelity,
            used_start,
            used_end,
            peak,
            delta_used,
            delta_peaked,
        }
    }
}

/// fastai's `b2mb`: bytes to MiB, rounded down.
pub fn b2mb(bytes: u64) -> u64 {
    bytes >> 20
}

/// A signed byte count to whole MiB, truncated toward zero like Python's `int()`.
pub fn b2mb_signed(bytes: i64) -> i64 {
    bytes / (1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    const MB: u64 = 1 << 20;

    #[test]
    fn fastai_rule_on_constructed_sequences() {
        // grew 10, blip of 30 above the net growth (peak 40 above start)
        assert_eq!(
            deltas(100 * MB, 110 * MB, 140 * MB),
            (10 * MB as i64, 30 * MB)
        );
        // released 20, peaked 40 above start: delta used negative, peaked not reduced
        assert_eq!(
            deltas(100 * MB, 80 * MB, 140 * MB),
            (-20 * MB as i64, 40 * MB)
        );
        // nothing happened
        assert_eq!(deltas(5, 5, 5), (0, 0));
        // peak below start (sampled source that missed the start): peaked 0
        assert_eq!(deltas(100, 90, 95), (-10, 0));
        // monotonic growth, peak equals end: no blip
        assert_eq!(deltas(0, 7 * MB, 7 * MB), (7 * MB as i64, 0));
        // extremes do not overflow
        assert_eq!(deltas(0, u64::MAX, u64::MAX), (i64::MAX, 0));
        assert_eq!(deltas(u64::MAX, 0, u64::MAX).0, i64::MIN);
    }

    #[test]
    fn b2mb_rounds_down_and_truncates() {
        assert_eq!(b2mb(MB - 1), 0);
        assert_eq!(b2mb(3 * MB + 5), 3);
        assert_eq!(b2mb_signed(-(MB as i64) - 5), -1);
        assert_eq!(b2mb_signed(-5), 0);
    }
}
