//! Leak trends across epochs: an observer of a tracker's epochs that
//! writes each epoch record's `leaks` under the tracker's [`LeakPolicy`].
//! When a cache release runs at an epoch's end, the reading taken after it
//! is used: a leak is what stays once caches are emptied.

use crate::leak::{LeakPolicy, LeakStatus};
use crate::observer::PhaseObserver;
use crate::phase::PhaseKind;
use crate::record::Record;

/// The leak trends of a tracker's sources under its rule: an observer of
/// its epochs, which writes each epoch record's `leaks`.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeakTrends {
    policy: Option<LeakPolicy>,
    per_source: Vec<LeakTracker>,
}

impl LeakTrends {
    /// Trends starting now for `sources` sources under `policy` (`None`:
    /// none are followed).
    pub(crate) fn new(policy: Option<LeakPolicy>, sources: usize) -> LeakTrends {
        LeakTrends {
            policy,
            per_source: vec![LeakTracker::default(); sources],
        }
    }

    /// The trend of source `index`, if there is such a source.
    pub(crate) fn status(&self, index: usize) -> Option<LeakStatus> {
        self.per_source.get(index).map(LeakTracker::status)
    }
}

impl PhaseObserver for LeakTrends {
    fn on_phase_record(&mut self, record: &mut Record) {
        let Some(policy) = self.policy else {
            return;
        };
        if record.phase.as_ref().map(|p| p.kind) != Some(PhaseKind::Epoch) {
            return;
        }
        // A leak is what stays after the caches are emptied: when a
        // release ran at this epoch's end, use the reading after it.
        let after = record.releases.last().map(|e| &e.after);
        let leaks = self
            .per_source
            .iter_mut()
            .zip(&record.sources)
            .enumerate()
            .map(|(i, (t, d))| {
                let end = after.and_then(|a| a.get(i).copied()).unwrap_or(d.used_end);
                t.observe(&policy, end)
            })
            .collect();
        record.leaks = leaks;
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct LeakTracker {
    last_end: Option<u64>,
    status: LeakStatus,
}

impl LeakTracker {
    pub(crate) fn observe(&mut self, policy: &LeakPolicy, end: u64) -> LeakStatus {
        if let Some(prev) = self.last_end {
            let growth = i128::from(end) - i128::from(prev);
            self.status.last_growth =
                growth.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
            if growth > i128::from(policy.threshold) {
                self.status.streak += 1;
            } else {
                self.status.streak = 0;
            }
            self.status.flagged = self.status.streak >= policy.epochs;
        }
        self.last_end = Some(end);
        self.status
    }

    pub(crate) fn status(&self) -> LeakStatus {
        self.status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_after_k_growing_epochs_and_clears() {
        let p = LeakPolicy {
            threshold: 10,
            epochs: 3,
        };
        let mut t = LeakTracker::default();
        let flags: Vec<bool> = [100, 120, 140, 160, 180, 185, 200]
            .iter()
            .map(|&e| t.observe(&p, e).flagged)
            .collect();
        // growth: -, 20, 20, 20, 20, 5, 15
        assert_eq!(flags, vec![false, false, false, true, true, false, false]);
        assert_eq!(t.status().streak, 1);
        assert_eq!(t.status().last_growth, 15);
    }
}
