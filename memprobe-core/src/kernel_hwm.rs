//! This process's kernel high-water mark of RSS (`VmHWM`), read and reset.
//!
//! Reset: writing `5` to `/proc/self/clear_refs` sets the mark to the current
//! RSS (Linux ≥ 4.0). Read: `getrusage(RUSAGE_SELF).ru_maxrss` costs one
//! syscall, but the kernel reports `max(signal->maxrss, mm high-water mark)`.
//! `signal->maxrss` holds the high-water mark of the image this process
//! replaced at `exec` — the launcher's, often larger than ours — and is only
//! raised again when the whole process exits, so it is a constant floor that
//! no reset lowers. memprobe learns it lazily: a reading above the best known
//! upper bound of the floor is exact; a reading at or below it is resolved
//! once from `/proc/self/status` (`VmHWM`, about 8× slower), which either
//! tightens the bound or pins the floor exactly. A process whose own memory
//! exceeds its launcher's (any real trainer) stays on the fast path; one that
//! stays below it pays the slow, still exact, read.

use crate::error::{Error, Result};
use crate::fork;
use crate::procfs::{self, ProcFile};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// Tolerance between RSS counters read two ways (per-CPU counter batching).
const SLACK_KB: u64 = 512;

pub(crate) struct KernelHwm {
    clear_refs: File,
    path: std::path::PathBuf,
    status: Option<ProcFile>,
    /// `signal->maxrss` in KiB, once pinned exactly.
    floor_kb: Option<u64>,
    /// An upper bound of `signal->maxrss` in KiB (`u64::MAX` = unknown).
    floor_bound_kb: u64,
    generation: u64,
}

impl KernelHwm {
    /// Opens `/proc/self/clear_refs` for writing and checks that a reset works.
    pub(crate) fn open(path: &std::path::Path) -> Result<Self> {
        let clear_refs = open_clear_refs(path)?;
        let mut hwm = KernelHwm {
            clear_refs,
            path: path.to_path_buf(),
            status: None,
            floor_kb: None,
            floor_bound_kb: u64::MAX,
            generation: fork::generation(),
        };
        hwm.write_reset()?;
        hwm.read()?;
        Ok(hwm)
    }

    fn check_fork(&mut self) -> Result<()> {
        if self.generation != fork::generation() {
            self.clear_refs = open_clear_refs(&self.path)?;
            self.status = None;
            // A forked child has its own signal struct: learn its floor anew.
            self.floor_kb = None;
            self.floor_bound_kb = u64::MAX;
            self.generation = fork::generation();
        }
        Ok(())
    }

    fn write_reset(&mut self) -> Result<()> {
        self.clear_refs.write_at(b"5", 0).map_err(|e| {
            Error::io(
                "reset the high-water mark through /proc/self/clear_refs",
                &e,
            )
        })?;
        Ok(())
    }

    /// Resets the mark to the current RSS; `rss_after` reads the RSS right
    /// after (the start of the next interval), which is returned.
    pub(crate) fn reset(&mut self, rss_after: impl FnOnce() -> Result<u64>) -> Result<u64> {
        self.check_fork()?;
        self.write_reset()?;
        rss_after()
    }

    /// The high-water mark since the last reset, bytes.
    pub(crate) fn read(&mut self) -> Result<u64> {
        self.check_fork()?;
        let kb = maxrss_kb();
        let above_floor = match self.floor_kb {
            Some(floor) => kb > floor,
            None => kb > self.floor_bound_kb,
        };
        if above_floor {
            return Ok(kb * 1024);
        }
        // Ambiguous: the floor may hide the true mark. Ask the exact source,
        // and learn from the answer.
        let exact_kb = self.read_status()? / 1024;
        if exact_kb + SLACK_KB < kb {
            self.floor_kb = Some(kb);
        } else {
            self.floor_bound_kb = self.floor_bound_kb.min(kb);
        }
        Ok(exact_kb * 1024)
    }

    /// `VmHWM` from `/proc/self/status`, bytes (the slow, always-exact path).
    pub(crate) fn read_status(&mut self) -> Result<u64> {
        if self.status.is_none() {
            self.status = Some(ProcFile::open("/proc/self/status")?);
        }
        let f = self.status.as_mut().expect("opened above");
        let text = f.read()?;
        match procfs::keyed_u64(text, b"VmHWM") {
            Some(kb) => Ok(kb * 1024),
            None => Err(procfs::malformed(f.path(), "no VmHWM line")),
        }
    }
}

fn open_clear_refs(path: &std::path::Path) -> Result<File> {
    OpenOptions::new().write(true).open(path).map_err(|e| {
        Error::io(
            format!("open {} for writing (clear_refs)", path.display()),
            &e,
        )
    })
}

fn maxrss_kb() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it and cannot fail for RUSAGE_SELF.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    u64::try_from(ru.ru_maxrss).unwrap_or(0)
}
