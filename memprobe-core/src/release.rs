//! Cache release: callbacks the caller registers (empty a framework's
//! allocator cache, run the garbage collector) and the policies that call
//! them — every N steps or epochs (robo_orchard's ClearCacheHook: fires when
//! `(index + 1) % N == 0`), or when free memory falls below a threshold.

use crate::error::{Error, Result};
use crate::phase::PhaseKind;

/// What a release callback frees. (Its C numbering belongs to the C ABI,
/// memprobe-ffi.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseKind {
    /// A framework's cache (e.g. `torch.cuda.empty_cache`). Always run.
    Cache,
    /// A garbage collector (e.g. Python's `gc.collect`). Run when the policy
    /// asks for it (ClearCacheHook's `garbage_collection`).
    Gc,
}

/// A release callback.
pub type ReleaseFn = Box<dyn FnMut() -> Result<()> + Send>;

pub(crate) struct Releaser {
    pub(crate) name: String,
    pub(crate) kind: ReleaseKind,
    pub(crate) f: ReleaseFn,
}

/// When releases fire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReleasePolicy {
    /// At the end of every `n`-th phase of `kind` (step or epoch): when
    /// `(index + 1) % n == 0`. `gc` also runs the GC callbacks.
    Every {
        /// Step or epoch.
        kind: PhaseKind,
        /// Period, ≥ 1.
        n: u64,
        /// Also run garbage-collector callbacks.
        gc: bool,
    },
    /// At the end of any step or epoch where source `source`'s free bytes
    /// (GPU free, host MemAvailable, cgroup limit − usage) are below `bytes`.
    BelowFree {
        /// Index of the source among the tracker's sources.
        source: usize,
        /// Threshold in bytes.
        bytes: u64,
        /// Also run garbage-collector callbacks.
        gc: bool,
    },
}

/// Why a release fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ReleaseReason {
    /// An `Every` policy.
    Periodic = 0,
    /// A `BelowFree` policy.
    LowMemory = 1,
    /// Out-of-memory recovery.
    OutOfMemory = 2,
    /// The caller asked.
    Manual = 3,
}

/// One firing: which callbacks ran and what each source read before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseEvent {
    /// Why.
    pub reason: ReleaseReason,
    /// The phase whose end triggered it (None for manual/OOM releases).
    pub phase: Option<(PhaseKind, u64)>,
    /// Callbacks run, by name; a failed one is listed in `errors`.
    pub ran: Vec<String>,
    /// Failures: callback name and message.
    pub errors: Vec<(String, String)>,
    /// `used` of each source before the release, bytes.
    pub before: Vec<u64>,
    /// `used` of each source after, bytes.
    pub after: Vec<u64>,
}

impl ReleaseEvent {
    /// Bytes freed per source (before − after, 0 if it grew).
    pub fn freed(&self) -> Vec<u64> {
        self.before
            .iter()
            .zip(&self.after)
            .map(|(b, a)| b.saturating_sub(*a))
            .collect()
    }
}

pub(crate) fn validate(policy: &ReleasePolicy, n_sources: usize) -> Result<()> {
    match *policy {
        ReleasePolicy::Every { kind, n, .. } => {
            if !matches!(kind, PhaseKind::Step | PhaseKind::Epoch) {
                return Err(Error::invalid("periodic release is per step or per epoch"));
            }
            if n == 0 {
                return Err(Error::invalid("release period must be at least 1"));
            }
        }
        ReleasePolicy::BelowFree { source, .. } => {
            if source >= n_sources {
                return Err(Error::new(
                    crate::ErrorKind::InvalidId,
                    format!("source index {source} out of range (0..{n_sources})"),
                ));
            }
        }
    }
    Ok(())
}
