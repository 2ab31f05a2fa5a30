//! Constructors of the built-in sources.
//!
//! Sources backed by a process-wide kernel counter (this process's `VmHWM`,
//! the cgroup's peak) are shared: every call returns the same [`Source`], so
//! all windows over it fold into one another correctly.

use crate::callback::{CallbackSampler, ReadFn};
use crate::cgroup::{CgroupOptions, CgroupSampler};
use crate::error::Result;
use crate::lock::Lock;
use crate::process::{HwmMode, ProcessSampler};
use crate::smaps::{SmapsMetric, SmapsSampler};
use crate::source::Source;
use crate::system::SystemRamSampler;
use crate::tree::ProcessTreeSampler;

static PROCESS: Lock<Option<Source>> = Lock::new(None);
static CGROUP: Lock<Option<Source>> = Lock::new(None);

/// Set to `1` to keep `VmHWM` untouched process-wide: [`Source::process`]
/// then samples its peak instead of resetting the kernel mark.
pub const PRESERVE_VMHWM_ENV: &str = "MEMPROBE_PRESERVE_VMHWM";

fn shared(cell: &Lock<Option<Source>>, make: impl FnOnce() -> Result<Source>) -> Result<Source> {
    let mut slot = cell.lock()?;
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let s = make()?;
    *slot = Some(s.clone());
    Ok(s)
}

impl Source {
    /// This process's RSS, with an exact peak from the kernel high-water mark
    /// (unless `MEMPROBE_PRESERVE_VMHWM=1`, or the mark cannot be reset: then
    /// sampled). Shared process-wide.
    pub fn process() -> Result<Source> {
        shared(&PROCESS, || {
            let preserve = std::env::var(PRESERVE_VMHWM_ENV).is_ok_and(|v| v == "1");
            let mode = if preserve {
                HwmMode::Preserve
            } else {
                HwmMode::Reset
            };
            Ok(Source::from_sampler(Box::new(ProcessSampler::new(mode)?)))
        })
    }

    /// This process's RSS with `VmHWM` left untouched: peaks are sampled by
    /// the monitor. A new, independent source each call.
    pub fn process_preserving_hwm() -> Result<Source> {
        Ok(Source::from_sampler(Box::new(ProcessSampler::new(
            HwmMode::Preserve,
        )?)))
    }

    /// This process and its descendants (sampled).
    pub fn process_tree() -> Result<Source> {
        Ok(Source::from_sampler(Box::new(ProcessTreeSampler::new()?)))
    }

    /// The machine's RAM (sampled).
    pub fn system_ram() -> Result<Source> {
        Ok(Source::from_sampler(Box::new(SystemRamSampler::new()?)))
    }

    /// The container's memory cgroup (exact where the kernel's peak can be
    /// reset, else sampled). Shared process-wide.
    pub fn cgroup() -> Result<Source> {
        shared(&CGROUP, || {
            Ok(Source::from_sampler(Box::new(CgroupSampler::new(
                CgroupOptions::default(),
            )?)))
        })
    }

    /// PSS or USS from smaps_rollup (opt-in: costs milliseconds per GiB).
    pub fn smaps(metric: SmapsMetric) -> Result<Source> {
        Ok(Source::from_sampler(Box::new(SmapsSampler::new(metric)?)))
    }

    /// A custom source read by calling `read` (sampled by the monitor).
    pub fn callback(name: &str, read: ReadFn) -> Result<Source> {
        Ok(Source::from_sampler(Box::new(CallbackSampler::new(
            name, read,
        )?)))
    }
}
