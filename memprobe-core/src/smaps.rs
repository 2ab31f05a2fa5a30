//! Proportional and unique set sizes from `/proc/self/smaps_rollup`. Opt-in:
//! the kernel walks every page table to produce it (milliseconds per GiB).
//! The parser of `smaps_rollup` ([`SmapsRollup`]) is shared with the tree's
//! PSS and USS (`tree_smaps`).

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

impl SmapsMetric {
    /// `"pss"` or `"uss"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SmapsMetric::Pss => "pss",
            SmapsMetric::Uss => "uss",
        }
    }
}

/// The figures memprobe takes from one `smaps_rollup`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmapsRollup {
    /// `Pss`: the process's share of every page it maps (a page shared by
    /// n processes counts 1/n in each).
    pub pss: u64,
    /// `Private_Clean + Private_Dirty`: pages mapped by this process alone.
    pub uss: u64,
}

impl SmapsRollup {
    /// Parses the text of a `smaps_rollup` file; `None` when a line is missing.
    pub fn parse(text: &[u8]) -> Option<SmapsRollup> {
        let kb = |key: &[u8]| procfs::keyed_u64(text, key);
        let pss = kb(b"Pss")?;
        let uss = kb(b"Private_Clean")?.checked_add(kb(b"Private_Dirty")?)?;
        Some(SmapsRollup {
            pss: pss.saturating_mul(1024),
            uss: uss.saturating_mul(1024),
        })
    }

    /// The figure `metric` names.
    pub fn get(&self, metric: SmapsMetric) -> u64 {
        match metric {
            SmapsMetric::Pss => self.pss,
            SmapsMetric::Uss => self.uss,
        }
    }
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
        let Some(rollup) = SmapsRollup::parse(text) else {
            return Err(procfs::malformed(
                self.file.path(),
                "missing Pss/Private lines",
            ));
        };
        Ok(Sample::timed(rollup.get(self.metric), t0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_rollup() {
        let text = b"55d0c0a00000-7ffd1a3f2000 ---p 00000000 00:00 0  [rollup]\n\
Rss:              262400 kB\nPss:               66000 kB\nPss_Anon:          65536 kB\n\
Shared_Clean:       1024 kB\nShared_Dirty:     262144 kB\nPrivate_Clean:       100 kB\n\
Private_Dirty:       200 kB\nReferenced:       262400 kB\n";
        let r = SmapsRollup::parse(text).unwrap();
        assert_eq!(r.pss, 66000 * 1024);
        assert_eq!(r.uss, 300 * 1024);
        assert_eq!(r.get(SmapsMetric::Uss), 300 * 1024);
        // Pss_Anon is not Pss.
        assert_eq!(
            SmapsRollup::parse(b"Pss_Anon: 5 kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 1 kB\n"),
            None
        );
        assert_eq!(SmapsRollup::parse(b""), None);
    }
}
