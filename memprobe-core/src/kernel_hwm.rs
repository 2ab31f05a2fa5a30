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
//!
//! Precision (see [`peak_error_bound`]): since Linux 6.2 the RSS counters are
//! per-CPU, and the kernel stores its mark (at a reset, and before each unmap
//! lowers the RSS) from their approximate sum, while `getrusage` adds the
//! approximate *current* RSS. `/proc/self/statm` sums the per-CPU parts
//! exactly since Linux 6.16, so every read also takes the current RSS from
//! `statm`: a peak still resident at the read is then exact, and the reading
//! is never below the `VmHWM` of `/proc/self/status` read at the same moment
//! (which is `max(stored mark, exact current RSS)`).

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
    /// The highest exact RSS read since the last reset, bytes (0: none
    /// yet). The mark is never below it, so a reading within the slack
    /// of it is the mark, whatever the floor (see [`resolve`](Self::resolve)).
    rss_seen: u64,
    /// Resets written to `clear_refs` (the tests count the skipped ones).
    #[cfg(test)]
    resets_written: u64,
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
            rss_seen: 0,
            #[cfg(test)]
            resets_written: 0,
            generation: fork::generation(),
        };
        // Before the first reset the mark covers everything since exec, so a
        // launcher larger than this process shows here: learn the floor once.
        hwm.learn_floor()?;
        hwm.write_reset()?;
        Ok(hwm)
    }

    fn check_fork(&mut self) -> Result<()> {
        if self.generation != fork::generation() {
            self.clear_refs = open_clear_refs(&self.path)?;
            self.status = None;
            // A forked child has its own signal struct: learn its floor anew.
            self.floor_kb = None;
            self.floor_bound_kb = u64::MAX;
            self.rss_seen = 0;
            self.generation = fork::generation();
            self.learn_floor()?;
        }
        Ok(())
    }

    fn write_reset(&mut self) -> Result<()> {
        #[cfg(test)]
        {
            self.resets_written += 1;
        }
        self.clear_refs.write_at(b"5", 0).map_err(|e| {
            Error::io(
                "reset the high-water mark through /proc/self/clear_refs",
                &e,
            )
        })?;
        Ok(())
    }

    /// Resets the mark to the current RSS; `rss_now` reads the exact RSS
    /// (the end of the ended interval and the start of the next), which is
    /// returned.
    ///
    /// The write is skipped when getrusage, read first, is at or below the
    /// RSS read next: getrusage is never below the kernel's stored mark, so
    /// the mark is then at or below the current RSS — where a reset would
    /// put it — and every later reading is the next interval's own. A
    /// process whose RSS stays level (a GPU trainer's host side) saves the
    /// write, the costliest of a boundary's system calls, for a getrusage.
    pub(crate) fn reset(&mut self, rss_now: impl FnOnce() -> Result<u64>) -> Result<u64> {
        self.check_fork()?;
        let kb = maxrss_kb();
        // Read before the write: a failed read leaves the mark as it was,
        // and a rise after getrusage belongs to the next interval (the
        // write, if any, sets the mark at or above it).
        let now = rss_now()?;
        self.reset_unless_level(kb, now)?;
        Ok(now)
    }

    /// The reset's decision, for getrusage's `kb` read before the exact
    /// RSS `now` (bytes).
    fn reset_unless_level(&mut self, kb: u64, now: u64) -> Result<()> {
        if kb.saturating_mul(1024) > now {
            self.write_reset()?;
        }
        self.rss_seen = now;
        Ok(())
    }

    /// Compares getrusage with `VmHWM` once: if getrusage is higher, the
    /// difference is the exec floor, pinned exactly.
    fn learn_floor(&mut self) -> Result<()> {
        let kb = maxrss_kb();
        let exact_kb = self.read_status()? / 1024;
        if exact_kb + SLACK_KB < kb {
            self.floor_kb = Some(kb);
        } else {
            self.floor_bound_kb = kb;
        }
        Ok(())
    }

    /// The high-water mark since the last reset, bytes. `rss_now` reads the
    /// current RSS (a mark equal to it is the mark, whatever the floor).
    pub(crate) fn read(&mut self, rss_now: impl FnOnce() -> Result<u64>) -> Result<u64> {
        self.check_fork()?;
        let kb = maxrss_kb();
        // getrusage adds the *approximate* current RSS (per-CPU counters not
        // yet folded: up to hundreds of KiB low); statm sums them (Linux ≥
        // 6.16), so a peak still resident now is read exactly.
        let now = rss_now()?;
        self.rss_seen = self.rss_seen.max(now);
        if self.above_floor(kb) {
            return Ok((kb * 1024).max(now));
        }
        self.resolve(kb, now)
    }

    /// The mark read by a boundary, which resets it next and then reads the
    /// exact RSS (the end of the ended interval as well as the start of the
    /// next). That reading covers what [`read`](Self::read) takes `statm`
    /// for, a peak still resident, so above the exec floor this reads
    /// getrusage alone: the boundary's peak, the max of the two, is never
    /// below a `VmHWM` read at the same moment. `rss_now` is read only when
    /// the floor must be resolved.
    pub(crate) fn read_before_reset(
        &mut self,
        rss_now: impl FnOnce() -> Result<u64>,
    ) -> Result<u64> {
        self.check_fork()?;
        let kb = maxrss_kb();
        if self.above_floor(kb) {
            return Ok(kb * 1024);
        }
        // At or below the floor's bound, but settled by an RSS read since
        // the reset (the last boundary's own reading), without a read: a
        // process whose RSS stays level takes this path at every boundary.
        if self.rss_seen > 0 {
            if let Some(mark) = settled(kb, self.rss_seen) {
                return Ok(mark);
            }
        }
        let now = rss_now()?;
        self.rss_seen = self.rss_seen.max(now);
        self.resolve(kb, now)
    }

    /// Whether a getrusage reading of `kb` is above the exec floor (then it
    /// is this process's own mark, up to the kernel's counting). Every
    /// reading is itself a bound of the floor (getrusage is never below
    /// it): the lowest one seen is kept, so that a process whose mark rose
    /// above its lowest reading stays on this fast path.
    fn above_floor(&mut self, kb: u64) -> bool {
        match self.floor_kb {
            Some(floor) => kb > floor,
            None => {
                let above = kb > self.floor_bound_kb;
                self.floor_bound_kb = self.floor_bound_kb.min(kb);
                above
            }
        }
    }

    /// The mark when getrusage's `kb` may be the exec floor; `now` is the
    /// exact current RSS.
    fn resolve(&mut self, kb: u64, now: u64) -> Result<u64> {
        // Ambiguous: the floor may hide the true mark. Settled by the
        // current RSS; otherwise ask /proc/self/status, and learn.
        if let Some(mark) = settled(kb, now) {
            return Ok(mark);
        }
        let exact_kb = self.read_status()? / 1024;
        if exact_kb + SLACK_KB < kb {
            self.floor_kb = Some(kb);
        } else {
            self.floor_bound_kb = self.floor_bound_kb.min(kb);
        }
        Ok((exact_kb * 1024).max(now))
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

/// The mark, when a getrusage reading of `kb` that may be the exec floor is
/// within the slack of `rss`, an exact RSS (bytes) read since the last
/// reset: the mark is never below such a reading, so the reading is the
/// mark (up to the slack).
fn settled(kb: u64, rss: u64) -> Option<u64> {
    (kb <= rss / 1024 + SLACK_KB / 4).then(|| (kb * 1024).max(rss))
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

/// How far this process's exact RSS peak can be from the true peak on this
/// machine, from the kernel's counting alone (bytes). See
/// [`peak_error_bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeakErrorBound {
    /// For a peak still resident when the window reads it: 0 where
    /// `/proc/self/statm` is exact (Linux ≥ 6.16), else as `freed`.
    pub held: u64,
    /// For a peak freed (unmapped) before the window read it, which the kernel
    /// recorded from its approximate counters; also how far above the RSS a
    /// reset may place the mark. A reading may be this much low or high.
    pub freed: u64,
    /// Online CPUs the bound was computed for.
    pub cpus: u64,
    /// The kernel release, `(major, minor)`, the bound was computed for.
    pub kernel: (u32, u32),
}

/// The bound of this machine's kernel RSS counting, which every exact RSS
/// peak inherits.
///
/// Linux ≥ 6.2 keeps each of the three resident counters (anonymous, file,
/// shared memory) per CPU and folds a CPU's part into the total once it
/// reaches the batch, `max(32, 2 × CPUs)` pages; so a reading that does not
/// sum the parts is off by less than `3 × CPUs × batch` pages: with 4 KiB
/// pages, 744 KiB on 2 CPUs, 5.8 MiB on 16, 95 MiB on 64 (in practice a
/// fraction: only the CPUs the process ran on since their last fold count).
/// Before 6.2 each thread caches up to 64 page-fault updates before folding
/// them: 64 pages × threads.
pub fn peak_error_bound() -> PeakErrorBound {
    // SAFETY: sysconf has no preconditions.
    let cpus = u64::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
        .unwrap_or(1)
        .max(1);
    let kernel = kernel_release();
    let page = procfs::page_size();
    let freed = if kernel >= (6, 2) {
        let batch = (2 * cpus).max(32);
        3 * cpus * (batch - 1) * page
    } else {
        64 * thread_count() * page
    };
    let held = if kernel >= (6, 16) { 0 } else { freed };
    PeakErrorBound {
        held,
        freed,
        cpus,
        kernel,
    }
}

/// `(major, minor)` of the running kernel (`(0, 0)` if unreadable, which
/// selects the older, per-thread bound).
fn kernel_release() -> (u32, u32) {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (0, 0);
    }
    let release: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    parse_release(&release)
}

fn parse_release(release: &[u8]) -> (u32, u32) {
    let mut parts = release.split(|&c| c == b'.' || c == b'-').map(|p| {
        std::str::from_utf8(p)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
    });
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (0, 0),
    }
}

fn thread_count() -> u64 {
    std::fs::read("/proc/self/status")
        .ok()
        .and_then(|t| procfs::keyed_u64(&t, b"Threads"))
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_is_written_only_when_the_mark_may_be_above_the_rss() {
        let mut hwm = KernelHwm::open(std::path::Path::new("/proc/self/clear_refs")).unwrap();
        let base = hwm.resets_written;
        // getrusage at the RSS, or below it: the mark is there already.
        hwm.reset_unless_level(1000, 1000 * 1024).unwrap();
        hwm.reset_unless_level(999, 1000 * 1024).unwrap();
        assert_eq!(hwm.resets_written, base);
        assert_eq!(hwm.rss_seen, 1000 * 1024);
        // One KiB above: a spike since freed may hold the mark; reset.
        hwm.reset_unless_level(1001, 1000 * 1024).unwrap();
        assert_eq!(hwm.resets_written, base + 1);
        hwm.reset_unless_level(u64::MAX, 0).unwrap();
        assert_eq!(hwm.resets_written, base + 2);
        assert_eq!(hwm.rss_seen, 0);
    }

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(parse_release(b"6.18.44-fc-v769"), (6, 18));
        assert_eq!(parse_release(b"5.15.0-105-generic"), (5, 15));
        assert_eq!(parse_release(b"garbage"), (0, 0));
    }

    #[test]
    fn the_bound_follows_cpus_and_kernel() {
        let b = peak_error_bound();
        assert!(b.cpus >= 1 && b.freed > 0, "{b:?}");
        if b.kernel >= (6, 2) {
            let batch = (2 * b.cpus).max(32);
            assert_eq!(b.freed, 3 * b.cpus * (batch - 1) * procfs::page_size());
        }
        assert_eq!(b.held == 0, b.kernel >= (6, 16), "{b:?}");
    }
}
