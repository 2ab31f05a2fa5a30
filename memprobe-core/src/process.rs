//! One process's memory. This process's resident set: `/proc/self/statm`
//! kept open (one `pread` per reading), with an exact peak from the kernel
//! high-water mark ([`ProcessSampler`]), within the kernel's own counting
//! bound ([`peak_error_bound`]). Any process's status: its
//! `/proc/<pid>/status` kept open ([`StatusFile`]), which gives the resident
//! set, the kernel high-water mark, the name, the parent and the thread count
//! in one read.

use crate::error::{Error, Result};
use crate::kernel_hwm::KernelHwm;
pub use crate::kernel_hwm::{peak_error_bound, PeakErrorBound};
use crate::procfs::{self, ProcFile, ProcessStatus};
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use std::fs::File;

/// A process's `/proc/<pid>/status`, kept open and re-read with one `pread`.
///
/// The descriptor belongs to the process it was opened for, not to the
/// number: once that process is gone reads fail, even if the pid is reused,
/// so readings never mix two processes.
#[derive(Debug)]
pub struct StatusFile {
    pid: u32,
    /// `None` when no descriptor could be had (the descriptor limit): the
    /// path is then opened at each read.
    file: Option<File>,
}

impl StatusFile {
    /// Opens the status file of `pid` (never fails: see [`read`](Self::read)).
    pub fn open(pid: u32) -> StatusFile {
        StatusFile {
            pid,
            file: File::open(format!("/proc/{pid}/status")).ok(),
        }
    }

    /// The status file of `pid`, opened at each read instead of kept open
    /// (for a caller short of descriptors). The descriptor's guarantee
    /// goes: a pid reused between two reads is read as the same process.
    pub fn by_path(pid: u32) -> StatusFile {
        StatusFile { pid, file: None }
    }

    /// The status of `pid` read through the file at `path` kept open (one
    /// of its threads' `/proc/<pid>/task/<tid>/status`: the memory figures
    /// are the process's); where it cannot be opened, reads go to
    /// `/proc/<pid>/status`.
    pub fn open_path(pid: u32, path: &std::path::Path) -> StatusFile {
        StatusFile {
            pid,
            file: File::open(path).ok(),
        }
    }

    /// Whether a descriptor is kept open.
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads the process, using `buf` as scratch space; `None` once it has
    /// exited (a zombie has no memory lines) or cannot be read.
    pub fn read(&self, buf: &mut Vec<u8>) -> Option<ProcessStatus> {
        let len = match &self.file {
            Some(f) => procfs::read_whole(f, buf).ok()?,
            None => {
                let f = File::open(format!("/proc/{}/status", self.pid)).ok()?;
                procfs::read_whole(&f, buf).ok()?
            }
        };
        procfs::parse_status(&buf[..len])
    }
}

/// Every process id in `/proc` (this PID namespace's processes).
pub fn all_pids() -> std::io::Result<Vec<u32>> {
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect())
}

/// The command name of `pid` (`/proc/<pid>/comm`); `None` if it is gone.
pub fn command_name(pid: u32) -> Option<String> {
    let text = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    Some(String::from_utf8_lossy(text.trim_ascii()).into_owned())
}

/// The wait status of `pid` while it is a zombie (ended, not yet reaped by
/// its parent): the `exit_code` field of `/proc/<pid>/stat` (Linux ≥ 3.5),
/// encoded as `waitpid` gives it (`libc::WIFSIGNALED`, `libc::WTERMSIG`).
/// `None` while it runs, once it is reaped, or on kernels without the field.
/// This is how a process that is not one's own child can be seen to have
/// died of a signal (the kernel's OOM killer sends `SIGKILL`).
pub fn zombie_wait_status(pid: u32) -> Option<i32> {
    procfs::parse_zombie_status(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

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
    statm: Statm,
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
        let statm = Statm {
            file: ProcFile::open("/proc/self/statm")?,
            page_size: procfs::page_size(),
        };
        let (hwm, hwm_error) = match mode {
            HwmMode::Preserve => (None, None),
            HwmMode::Reset => match KernelHwm::open(clear_refs.as_ref()) {
                Ok(h) => (Some(h), None),
                Err(e) => (None, Some(e)),
            },
        };
        let mut s = ProcessSampler {
            statm,
            hwm,
            hwm_error,
        };
        s.statm.rss()?;
        Ok(s)
    }

    /// Why peaks are sampled rather than exact, if they are.
    pub fn hwm_error(&self) -> Option<&Error> {
        self.hwm_error.as_ref()
    }

    /// Runs `f` on the kernel mark (`None` without one) with `statm`,
    /// both borrowed in place.
    fn with_mark(
        &mut self,
        f: impl FnOnce(&mut KernelHwm, &mut Statm) -> Result<u64>,
    ) -> Result<Option<u64>> {
        let Self { statm, hwm, .. } = self;
        match hwm {
            Some(hwm) => f(hwm, statm).map(Some),
            None => Ok(None),
        }
    }
}

/// `/proc/self/statm`, read for the resident set.
struct Statm {
    file: ProcFile,
    page_size: u64,
}

impl Statm {
    /// The resident set (the second field, in pages), bytes.
    fn rss(&mut self) -> Result<u64> {
        let text = self.file.read()?;
        match procfs::field_u64(text, 1) {
            Some(pages) => Ok(pages * self.page_size),
            None => Err(procfs::malformed(self.file.path(), "no resident field")),
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
        let used = self.statm.rss()?;
        Ok(Sample::timed(used, t0))
    }

    fn read_used(&mut self) -> Result<u64> {
        self.statm.rss()
    }

    fn read_peak(&mut self) -> Result<Option<u64>> {
        self.with_mark(|hwm, statm| hwm.read(|| statm.rss()))
    }

    fn read_peak_before_reset(&mut self) -> Result<Option<u64>> {
        self.with_mark(|hwm, statm| hwm.read_before_reset(|| statm.rss()))
    }

    fn reset_peak(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        match self.with_mark(|hwm, statm| hwm.reset(|| statm.rss()))? {
            Some(used) => Ok(Sample::timed(used, t0)),
            None => self.read(),
        }
    }

    fn reset_peak_used(&mut self) -> Result<u64> {
        match self.with_mark(|hwm, statm| hwm.reset(|| statm.rss()))? {
            Some(used) => Ok(used),
            None => self.read_used(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_refuses_a_missing_one() {
        let mut buf = Vec::new();
        let me = StatusFile::open(std::process::id());
        let r = me.read(&mut buf).unwrap();
        assert!(r.rss > 0 && r.hwm >= r.rss && r.threads >= 1, "{r:?}");
        assert_eq!(r.ppid, Some(std::os::unix::process::parent_id()));
        assert!(StatusFile::open(u32::MAX).read(&mut buf).is_none());
        assert_eq!(command_name(u32::MAX), None);
        assert!(command_name(std::process::id()).is_some_and(|n| !n.is_empty()));
        let pids = all_pids().unwrap();
        assert!(
            pids.contains(&std::process::id()) && pids.contains(&1),
            "{pids:?}"
        );
    }

    #[test]
    fn a_reused_pid_is_not_read_through_the_old_descriptor() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let f = StatusFile::open(child.id());
        let mut buf = Vec::new();
        assert!(f.read(&mut buf).is_some());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            f.read(&mut buf),
            None,
            "reaped: the descriptor reads nothing"
        );
    }

    #[test]
    fn a_killed_childs_status_while_it_is_a_zombie() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(zombie_wait_status(child.id()), None, "running");
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(s) = zombie_wait_status(child.id()) {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "never a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(libc::WIFSIGNALED(status), "{status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGKILL);
        child.wait().unwrap();
        assert_eq!(zombie_wait_status(child.id()), None, "reaped");
    }
}
