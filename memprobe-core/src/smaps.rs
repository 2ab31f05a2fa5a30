//! Proportional and unique set sizes from `/proc/self/smaps_rollup`. Opt-in:
//! the kernel walks every page table to produce it (milliseconds per GiB).

use crate::error::Result;
use crate::procfs::{self, ProcFile};
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;

/// Which figure of smaps_rollup to report as `used`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmapsMetric {
    /// PSS: shared pages divided among the processes sharing them.
    Pss,
    /// USS: pages private to this process (`Private_Clean + Private_Dirty`).
    Uss,
}

/// Reads PSS or USS of this process.
pub struct SmapsSampler {
    file: ProcFile,
    metric: SmapsMetric,
}

impl SmapsSampler {
    /// Opens `/proc/self/smaps_rollup` (Linux ≥ 4.14).
    pub fn new(metric: SmapsMetric) -> Result<Self> {
        let mut s = SmapsSampler {
            file: ProcFile::open("/proc/self/smaps_rollup")?,
            metric,
        };
        s.read()?;
        Ok(s)
    }
}

impl Sampler for SmapsSampler {
    fn info(&self) -> SourceInfo {
        let (name, kind) = match self.metric {
            SmapsMetric::Pss => ("pss", SourceKind::ProcessPss),
            SmapsMetric::Uss => ("uss", SourceKind::ProcessUss),
        };
        SourceInfo {
            name: name.into(),
            kind,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let text = self.file.read()?;
        let kb = match self.metric {
            SmapsMetric::Pss => procfs::keyed_u64(text, b"Pss"),
            SmapsMetric::Uss => procfs::keyed_u64(text, b"Private_Clean")
                .zip(procfs::keyed_u64(text, b"Private_Dirty"))
                .map(|(a, b)| a + b),
        };
        let Some(kb) = kb else {
            return Err(procfs::malformed(
                self.file.path(),
                "missing Pss/Private lines",
            ));
        };
        Ok(Sample::timed(kb * 1024, t0))
    }
}
