//! The machine's RAM from `/proc/meminfo`: `used = MemTotal - MemAvailable`.

use crate::error::Result;
use crate::procfs::{self, ProcFile};
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use std::path::Path;

/// Reads system RAM total and available.
pub struct SystemRamSampler {
    meminfo: ProcFile,
}

impl SystemRamSampler {
    /// Opens `/proc/meminfo`.
    pub fn new() -> Result<Self> {
        Self::at("/proc/meminfo")
    }

    /// Opens a meminfo-format file at `path` (for tests).
    pub fn at(path: impl AsRef<Path>) -> Result<Self> {
        let mut s = SystemRamSampler {
            meminfo: ProcFile::open(path)?,
        };
        s.read()?;
        Ok(s)
    }
}

impl Sampler for SystemRamSampler {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "system".into(),
            kind: SourceKind::SystemRam,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let text = self.meminfo.read()?;
        let total = procfs::keyed_u64(text, b"MemTotal");
        let avail = procfs::keyed_u64(text, b"MemAvailable");
        let (Some(total), Some(avail)) = (total, avail) else {
            return Err(procfs::malformed(
                self.meminfo.path(),
                "MemTotal or MemAvailable missing",
            ));
        };
        let (total, avail) = (total * 1024, avail * 1024);
        Ok(Sample {
            total: Some(total),
            free: Some(avail),
            ..Sample::timed(total.saturating_sub(avail), t0)
        })
    }
}
