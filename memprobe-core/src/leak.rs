//! Leak trends: a source whose end-of-epoch `used` grows by more than a
//! threshold for K epochs in a row is flagged; one epoch without such growth
//! clears the flag. When a cache release runs at an epoch's end, the reading
//! taken after it is used: a leak is what stays once caches are emptied.

/// The rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakPolicy {
    /// Growth per epoch above which an epoch counts as growing, bytes.
    pub threshold: u64,
    /// Consecutive growing epochs that raise the flag (≥ 1).
    pub epochs: u32,
}

/// The trend of one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakStatus {
    /// Growing for at least `epochs` epochs in a row.
    pub flagged: bool,
    /// Current run of growing epochs.
    pub streak: u32,
    /// Growth of the last ended epoch's end over the previous one's, bytes.
    pub last_growth: i64,
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
