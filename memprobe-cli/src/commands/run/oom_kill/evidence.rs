//! What the detector looks at: the tree's members, the container's
//! figures, the kernel's log of its kills, how births and deaths were
//! tracked, and the counter log.

use super::counters::CounterLog;

/// One process of the tree, as the detector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) pid: u32,
    pub(crate) ppid: Option<u32>,
    pub(crate) name: String,
    /// The last sample that saw it alive, ns since the start (`None`: no
    /// sample saw it; it is known from the kernel's process events or as an
    /// orphan memprobe reaped).
    pub(crate) last_seen_ns: Option<u64>,
    /// When it was born, where the kernel's process events said so.
    pub(crate) born_ns: Option<u64>,
    /// When it was seen ended (the direct child: when it terminated).
    pub(crate) ended_ns: Option<u64>,
    /// How it ended, in `waitpid`'s encoding, where that was seen.
    pub(crate) wait_status: Option<i32>,
    /// The last RSS sampled (0 when no sample saw it).
    pub(crate) last_rss: u64,
    /// The direct child's exact peak (`ru_maxrss` of the command alone);
    /// `None` for others.
    pub(crate) exact_peak: Option<u64>,
    pub(crate) direct_child: bool,
}

impl Member {
    pub(super) fn signal(&self) -> Option<i32> {
        let s = self.wait_status?;
        libc::WIFSIGNALED(s).then(|| libc::WTERMSIG(s))
    }

    /// Ended of something other than `SIGKILL`, as far as was seen.
    pub(super) fn ended_otherwise(&self) -> bool {
        self.wait_status.is_some() && self.signal() != Some(libc::SIGKILL)
    }

    /// Whether it is the process the kernel's record names: the same pid,
    /// the same name (the kernel's 15 bytes, or a name seen before an
    /// exec), alive at the kill (within `slack` of the record's time).
    pub(super) fn is(&self, k: &KernelKill, slack: u64) -> bool {
        let names_agree = self.name.is_empty()
            || self.name == k.name
            || (self.name.len() >= 15 && k.name.starts_with(&self.name[..15]))
            || (k.name.len() >= 15 && self.name.starts_with(&k.name));
        let born_before = self
            .born_ns
            .map_or(true, |b| b <= k.at_ns.saturating_add(slack));
        let ended_after = self
            .ended_ns
            .map_or(true, |e| e.saturating_add(slack) >= k.at_ns);
        self.pid == k.pid && names_agree && born_before && ended_after
    }
}

/// The container's figures the verdict quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Container {
    pub(crate) limit: Option<u64>,
    pub(crate) peak: Option<u64>,
    pub(crate) peak_exact: bool,
}

impl Container {
    /// At or within 5% (at least 16 MiB) of its limit.
    pub(super) fn near_limit(&self) -> bool {
        match (self.limit, self.peak) {
            (Some(limit), Some(peak)) => {
                let slack = (limit / 20).max(16 << 20);
                peak.saturating_add(slack) >= limit
            }
            _ => false,
        }
    }
}

/// One OOM kill in the kernel's log, on the run's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelKill {
    pub(crate) pid: u32,
    pub(crate) name: String,
    /// ns since the start (the kernel's clock is close to
    /// `CLOCK_MONOTONIC`; 0 when the record came before the start).
    pub(crate) at_ns: u64,
    pub(crate) rss_bytes: Option<u64>,
    pub(crate) memcg: Option<String>,
}

/// The kernel's log as evidence: the kills it named, or why it was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KernelRecord {
    Read {
        kills: Vec<KernelKill>,
        /// Records overwritten before memprobe read them.
        lost: u64,
    },
    Unreadable(String),
}

impl KernelRecord {
    /// The kernel's log read in full: every OOM kill during the run named.
    pub(super) fn complete(&self) -> Option<&[KernelKill]> {
        match self {
            KernelRecord::Read { kills, lost: 0 } => Some(kills),
            _ => None,
        }
    }
}

/// Everything the detector looks at.
#[derive(Debug, Clone)]
pub(crate) struct Inputs<'a> {
    pub(crate) counters: &'a CounterLog,
    /// The tree's members, the direct child among them.
    pub(crate) members: &'a [Member],
    pub(crate) container: Option<Container>,
    /// The sampling interval, ns.
    pub(crate) interval_ns: u64,
    /// `CLOCK_MONOTONIC` at the start, ns: times given to the phase lookup
    /// are absolute.
    pub(crate) t0_monotonic_ns: u64,
    /// The OOM kills the kernel logged, or why its log was not read.
    pub(crate) kernel: KernelRecord,
    /// How births and deaths were tracked: `Ok(())` with the kernel's
    /// process events, every one seen; `Err(why)` where samples (and the
    /// orphans memprobe reaps) were all there was.
    pub(crate) tracking: Result<(), String>,
}
