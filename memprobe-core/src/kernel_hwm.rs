//! This process's kernel high-water mark of RSS (`VmHWM`), read and reset.
//!
//! Reset: writing `5` to `/proc/self/clear_refs` sets the mark to the current
//! RSS (Linux ≥ 4.0). Read: `getrusage(RUSAGE_SELF).ru_maxrss` costs about one
//! syscall, but the kernel reports `max(signal->maxrss, mm high-water mark)`,
//! where `signal->maxrss` holds the high-water mark of the image before the
//! last `exec` (and, on older kernels, of exited threads). That floor does not
//! reset. So after each reset we probe `getrusage` once: if it exceeds the RSS
//! read at the reset, the floor is in the way and any reading equal to it is
//! resolved exactly from `/proc/self/status` (`VmHWM`, about 8× slower).
//! Readings above the floor are the true high-water mark.

use crate::error::{Error, Result};
use crate::fork;
use crate::procfs::{self, ProcFile};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// Tolerance between RSS counters read two ways (per-CPU counter batching).
const SLACK_KB: u64 = 512;

pub(crate) struct KernelHwm {
    clear_refs: File,
    status: Option<ProcFile>,
    /// `signal->maxrss` in KiB when it exceeds the RSS at the last reset, else 0.
    floor_kb: u64,
    generation: u64,
}

impl KernelHwm {
    /// Opens `/proc/self/clear_refs` for writing and checks that a reset works.
    pub(crate) fn open() -> Result<Self> {
        let clear_refs = open_clear_refs()?;
        let mut hwm = KernelHwm {
            clear_refs,
            status: None,
            floor_kb: 0,
            generation: fork::generation(),
        };
        hwm.write_reset()?;
        Ok(hwm)
    }

    fn check_fork(&mut self) -> Result<()> {
        if self.generation != fork::generation() {
            self.clear_refs = open_clear_refs()?;
            self.status = None;
            self.floor_kb = 0;
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

    /// Resets the mark; `rss_kb` is the RSS read right after, used to detect
    /// the `signal->maxrss` floor.
    pub(crate) fn reset(&mut self, rss_after: impl FnOnce() -> Result<u64>) -> Result<u64> {
        self.check_fork()?;
        self.write_reset()?;
        let rss = rss_after()?;
        let probe = maxrss_kb();
        self.floor_kb = if probe > rss / 1024 + SLACK_KB {
            probe
        } else {
            0
        };
        Ok(rss)
    }

    /// The high-water mark since the last reset, bytes.
    pub(crate) fn read(&mut self) -> Result<u64> {
        self.check_fork()?;
        let kb = maxrss_kb();
        if kb > self.floor_kb {
            return Ok(kb * 1024);
        }
        self.read_status()
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

fn open_clear_refs() -> Result<File> {
    OpenOptions::new()
        .write(true)
        .open("/proc/self/clear_refs")
        .map_err(|e| Error::io("open /proc/self/clear_refs for writing", &e))
}

fn maxrss_kb() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it and cannot fail for RUSAGE_SELF.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    u64::try_from(ru.ru_maxrss).unwrap_or(0)
}
