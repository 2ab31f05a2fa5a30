//! One reading of one source, and what describes a source.

use std::time::Duration;

/// One reading of one source. Every quantity is in bytes.
///
/// Fields the source cannot supply are `None`, never 0 pretending to be a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Bytes in use now (RSS for processes, usage for cgroups, used for GPUs).
    pub used: u64,
    /// Capacity of what is measured (physical RAM, GPU memory), if known.
    pub total: Option<u64>,
    /// Bytes still available, if known (MemAvailable, GPU free).
    pub free: Option<u64>,
    /// An enforced limit (a cgroup's memory limit); `None` means no limit.
    pub limit: Option<u64>,
    /// Bytes set aside and not usable (GPU driver reservation), if known.
    pub reserved: Option<u64>,
    /// When the reading was taken: nanoseconds on the monotonic clock
    /// (`CLOCK_MONOTONIC`, comparable across processes of one boot).
    pub taken_at_ns: u64,
    /// How long the read itself took, in nanoseconds.
    pub read_ns: u64,
}

impl Sample {
    /// A sample of `used` bytes with no other field known, stamped now.
    pub fn used(used: u64) -> Self {
        Sample {
            used,
            taken_at_ns: monotonic_ns(),
            ..Sample::default()
        }
    }

    /// A sample of `used` bytes from a read begun at `t0` (a
    /// [`monotonic_ns`] reading) and ending now: stamped `t0`, and the read
    /// took the time since. Other fields unknown; sources that know them set
    /// them with `..Sample::timed(used, t0)`.
    pub fn timed(used: u64, t0: u64) -> Self {
        Sample {
            used,
            taken_at_ns: t0,
            read_ns: monotonic_ns() - t0,
            ..Sample::default()
        }
    }
}

/// How trustworthy the peak of a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeakFidelity {
    /// The kernel (or driver) keeps a high-water mark: no spike is missed.
    Exact,
    /// The caller reports every change: as exact as the caller's pushes.
    Pushed,
    /// Polled at an interval: spikes shorter than the interval can be missed.
    Sampled,
}

impl PeakFidelity {
    /// Lowercase name (`exact`, `pushed`, `sampled`).
    pub fn as_str(self) -> &'static str {
        match self {
            PeakFidelity::Exact => "exact",
            PeakFidelity::Pushed => "pushed",
            PeakFidelity::Sampled => "sampled",
        }
    }
}

/// What a source measures.
// No `#[repr]` or discriminants here: the C numbering lives in memprobe-ffi,
// which maps each variant explicitly (a new variant fails to compile there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// This process's resident set.
    Process,
    /// This process and all its descendants (e.g. DataLoader workers).
    ProcessTree,
    /// The machine's RAM (`used` = total - available).
    SystemRam,
    /// The container's memory cgroup.
    Cgroup,
    /// A whole GPU device.
    GpuDevice,
    /// This process's memory on one GPU.
    GpuProcess,
    /// A source defined by the caller (callback or pushed values).
    Custom,
    /// This process's proportional set size (PSS, from smaps_rollup).
    ProcessPss,
    /// This process's unique set size (USS, from smaps_rollup).
    ProcessUss,
    /// This process's device memory on one GPU (or its pinned host memory)
    /// as counted by the driver-API interposer at every allocation and free.
    GpuExact,
    /// The PSS of this process and its descendants (shared pages counted
    /// once across the tree).
    ProcessTreePss,
    /// The USS of this process and its descendants (pages private to each).
    ProcessTreeUss,
}

impl SourceKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Process => "process",
            SourceKind::ProcessTree => "process_tree",
            SourceKind::SystemRam => "system_ram",
            SourceKind::Cgroup => "cgroup",
            SourceKind::GpuDevice => "gpu_device",
            SourceKind::GpuProcess => "gpu_process",
            SourceKind::Custom => "custom",
            SourceKind::ProcessPss => "process_pss",
            SourceKind::ProcessUss => "process_uss",
            SourceKind::GpuExact => "gpu_exact",
            SourceKind::ProcessTreePss => "process_tree_pss",
            SourceKind::ProcessTreeUss => "process_tree_uss",
        }
    }
}

/// The description of a source: its name, kind and peak fidelity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// Short unique-ish name used in reports (`rss`, `cgroup`, `gpu0`, ...).
    pub name: String,
    /// What is measured.
    pub kind: SourceKind,
    /// How exact its peaks are.
    pub fidelity: PeakFidelity,
}

/// The rule for names (sources, custom phases): 1 to 64 bytes, no control
/// characters, so that every report line and label stays printable.
pub(crate) fn check_name(what: &str, name: &str) -> crate::error::Result<()> {
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(crate::error::Error::invalid(format!(
            "{what} must be 1 to 64 printable bytes"
        )));
    }
    Ok(())
}

/// Nanoseconds on `CLOCK_MONOTONIC`: the clock of every timestamp memprobe
/// takes, the interposer's included (which uses this one).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Converts a duration to whole nanoseconds, saturating.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_sample_is_stamped_at_its_start_and_lasts_until_now() {
        let t0 = monotonic_ns();
        let s = Sample::timed(5, t0);
        let elapsed = monotonic_ns() - t0;
        assert_eq!((s.used, s.taken_at_ns), (5, t0));
        assert!(s.read_ns <= elapsed, "{} > {elapsed}", s.read_ns);
        assert_eq!(
            (s.total, s.free, s.limit, s.reserved),
            (None, None, None, None)
        );
    }
}
