//! Leaks: the rule ([`LeakPolicy`]) and one source's trend under it
//! ([`LeakStatus`], in each epoch record). A source whose end-of-epoch
//! `used` grows by more than a threshold for K epochs in a row is flagged;
//! one epoch without such growth clears the flag. The observer that follows
//! the trends is `leak_trends.rs`.

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
