//! The OOM retry: what a step run under [`Tracker::run_with_oom_retry`]
//! reports, and what the retry loop did (fastai's gpu_mem_restore). The
//! loop itself is a tracker method (it releases the tracker's caches).
//! "OOM retry" is one of the three meanings of OOM (docs/architecture.md,
//! "One name per OOM meaning"): not the OOM report, not the OOM kill.

use crate::release::ReleaseEvent;
#[cfg(doc)]
use crate::Tracker;

/// What a step run under [`Tracker::run_with_oom_retry`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// The step completed.
    Done,
    /// The step ran out of memory; release caches and retry.
    OutOfMemory,
}

/// The result of [`Tracker::run_with_oom_retry`]: the OOM retry's result
/// (not an OOM report: that is [`oom_report`](crate::oom_report)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomRetryResult {
    /// Whether the step finally completed.
    pub succeeded: bool,
    /// How many retries it took (0: it succeeded at once).
    pub retries: u32,
    /// The releases run between attempts.
    pub releases: Vec<ReleaseEvent>,
}

impl OomRetryResult {
    /// Bytes freed per source, summed over the releases.
    pub fn freed(&self) -> Vec<u64> {
        let mut total: Vec<u64> = Vec::new();
        for e in &self.releases {
            let f = e.freed();
            total.resize(f.len().max(total.len()), 0);
            for (t, v) in total.iter_mut().zip(f) {
                *t = t.saturating_add(v);
            }
        }
        total
    }
}

/// The old name of [`OomRetryResult`], which read as an OOM report. It
/// still names the same type, with a deprecation warning:
///
/// ```compile_fail
/// #![deny(deprecated)]
/// let _: Option<memprobe_core::OomReport> = None;
/// ```
#[deprecated(
    since = "0.1.0",
    note = "renamed OomRetryResult (an OOM report is memprobe_core::oom_report); removed in 0.3.0"
)]
pub type OomReport = OomRetryResult;
