//! This process's resident set: `/proc/self/statm` kept open (one `pread` per
//! reading), with an exact peak from the kernel high-water mark.

use crate::error::{Error, Result};
use crate::kernel_hwm::KernelHwm;
use crate::procfs::{self, ProcFile};
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;

/// How the process sampler treats the kernel's `VmHWM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HwmMode {
    /// Fold `VmHWM` into windows and reset it at each boundary: exact peaks,
    /// no polling. Other readers of `VmHWM` in this process see it reset.
    #[default]
    Reset,
    /// Never touch `VmHWM`; peaks are sampled by the monitor instead.
    Preserve,
}

/// Reads this process's RSS.
pub struct ProcessSampler {
    statm: ProcFile,
    page_size: u64,
    hwm: Option<KernelHwm>,
    /// Why the peak is not exact, when it is not.
    hwm_error: Option<Error>,
}

impl ProcessSampler {
    /// Opens `/proc/self/statm` and, with [`HwmMode::Reset`], the kernel
    /// high-water mark. If the mark cannot be reset (e.g. `/proc` mounted
    /// read-only), the sampler still works with sampled peaks and
    /// [`hwm_error`](Self::hwm_error) says why.
    pub fn new(mode: HwmMode) -> Result<Self> {
        Self::with_clear_refs(mode, "/proc/self/clear_refs")
    }

    /// Like [`new`](Self::new), resetting the mark through `clear_refs`
    /// instead of `/proc/self/clear_refs` (to test how the sampler degrades
    /// when the reset is refused).
    pub fn with_clear_refs(mode: HwmMode, clear_refs: impl AsRef<std::path::Path>) -> Result<Self> {
        let statm = ProcFile::open("/proc/self/statm")?;
        let (hwm, hwm_error) = match mode {
            HwmMode::Preserve => (None, None),
            HwmMode::Reset => match KernelHwm::open(clear_refs.as_ref()) {
                Ok(h) => (Some(h), None),
                Err(e) => (None, Some(e)),
            },
        };
        let mut s = ProcessSampler {
            statm,
            page_size: procfs::page_size(),
            hwm,
            hwm_error,
        };
        s.rss()?;
        Ok(s)
    }

    /// Why peaks are sampled rather than exact, if they are.
    pub fn hwm_error(&self) -> Option<&Error> {
        self.hwm_error.as_ref()
    }

    fn rss(&mut self) -> Result<u64> {
        let text = self.statm.read()?;
        match procfs::field_u64(text, 1) {
            Some(pages) => Ok(pages * self.page_size),
            None => Err(procfs::malformed(self.statm.path(), "no resident field")),
        }
    }
}

impl Sampler for ProcessSampler {
    fn info(&self) -> SourceInfo {
        let fidelity = if self.hwm.is_some() {
            PeakFidelity::Exact
        } else {
            PeakFidelity::Sampled
        };
        SourceInfo {
            name: "rss".into(),
            kind: SourceKind::Process,
            fidelity,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let used = self.rss()?;
        Ok(Sample {
            used,
            taken_at_ns: t0,
            read_ns: monotonic_ns() - t0,
            ..Sample::default()
        })
    }

    fn read_peak(&mut self) -> Result<Option<u64>> {
        match self.hwm.as_mut() {
            Some(h) => h.read().map(Some),
            None => Ok(None),
        }
    }

    fn reset_peak(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let Some(mut hwm) = self.hwm.take() else {
            return self.read();
        };
        let r = hwm.reset(|| self.rss());
        self.hwm = Some(hwm);
        let used = r?;
        Ok(Sample {
            used,
            taken_at_ns: t0,
            read_ns: monotonic_ns() - t0,
            ..Sample::default()
        })
    }
}
