//! Which entries of NVML's process list are this process, also inside a PID
//! namespace (containers).
//!
//! NVML traditionally reports *host* PIDs, while `getpid()` inside a
//! container returns the PID in the container's namespace; some newer drivers
//! translate PIDs into the caller's namespace instead. The `NSpid:` line of
//! `/proc/self/status` lists this process's PID in every namespace from the
//! one that mounted `/proc` down to its own, outermost first. memprobe
//! matches, in order:
//!
//! 1. the outermost PID `NSpid` shows (the host PID when `/proc` comes from
//!    the host's namespace, e.g. `docker run --pid=host` or a `/proc` mounted
//!    from outside);
//! 2. `getpid()` (no namespace, or a driver that translates PIDs).
//!
//! When the container's own `/proc` hides the host PID and the driver reports
//! host PIDs, this process cannot be recognised: its usage then reads 0 (or,
//! rarely, that of an unrelated host process whose PID equals this process's
//! namespace PID). The device-wide figures are unaffected.

use crate::process::{GpuProcess, GpuProcessKind};
use memprobe_core::internal::process::ProcessStatus;
use memprobe_core::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// This process's PIDs: the outermost visible one and `getpid()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnPids {
    /// The first `NSpid` value (equal to `own` outside namespaces).
    pub(crate) outermost: u32,
    /// `getpid()`.
    pub(crate) own: u32,
}

/// The last answer: `own` in the high half, `outermost` in the low half
/// (0: none yet). Lock-free, so a `fork()` at any instant leaves it usable.
static CACHE: AtomicU64 = AtomicU64::new(0);

impl OwnPids {
    /// This process's PIDs, cached until the PID changes (after `fork()`).
    pub(crate) fn current() -> OwnPids {
        let own = std::process::id();
        let cached = CACHE.load(Ordering::Relaxed);
        if cached != 0 && (cached >> 32) as u32 == own {
            return OwnPids {
                outermost: cached as u32,
                own,
            };
        }
        // `/proc/self`, not `/proc/<own>`: `own` is this namespace's pid,
        // which in a `/proc` from an outer namespace names another process.
        let outermost = std::fs::read("/proc/self/status")
            .ok()
            .and_then(|s| ProcessStatus::parse(&s))
            .and_then(|s| s.outermost_pid)
            .unwrap_or(own);
        CACHE.store(
            (u64::from(own) << 32) | u64::from(outermost),
            Ordering::Relaxed,
        );
        OwnPids { outermost, own }
    }
}

/// This process's bytes in `processes` (one device's compute and graphics
/// lists). A process that appears in both lists is counted once (the larger
/// figure); entries of one list with this PID (MIG instances) add up. `Ok(0)`
/// when this process is not listed (it has no context on the device).
pub(crate) fn own_usage(processes: &[GpuProcess], pids: OwnPids) -> Result<u64> {
    for pid in [pids.outermost, pids.own] {
        let mut compute = 0u64;
        let mut graphics = 0u64;
        let mut found = false;
        for p in processes.iter().filter(|p| p.pid == pid) {
            found = true;
            let used = p.used.ok_or_else(|| {
                Error::new(
                    ErrorKind::Unsupported,
                    "the driver does not report per-process GPU memory here \
                     (NVML_VALUE_NOT_AVAILABLE)",
                )
            })?;
            match p.kind {
                GpuProcessKind::Compute => compute = compute.saturating_add(used),
                GpuProcessKind::Graphics => graphics = graphics.saturating_add(used),
            }
        }
        if found {
            return Ok(compute.max(graphics));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, used: u64, kind: GpuProcessKind) -> GpuProcess {
        GpuProcess {
            pid,
            used: Some(used),
            kind,
        }
    }

    #[test]
    fn current_reads_this_process() {
        let p = OwnPids::current();
        assert_eq!(p.own, std::process::id());
        assert!(p.outermost > 0);
        assert_eq!(OwnPids::current(), p);
    }

    #[test]
    fn host_pid_is_preferred() {
        use GpuProcessKind::*;
        let pids = OwnPids {
            outermost: 4242,
            own: 7,
        };
        // pid 7 on the host is someone else: the host pid wins.
        let list = [p(7, 111, Compute), p(4242, 3000, Compute), p(9, 5, Compute)];
        assert_eq!(own_usage(&list, pids).unwrap(), 3000);
        // A driver that translated pids into our namespace.
        let list = [p(7, 111, Compute), p(9, 5, Compute)];
        assert_eq!(own_usage(&list, pids).unwrap(), 111);
        assert_eq!(own_usage(&[p(9, 5, Compute)], pids).unwrap(), 0);
        assert_eq!(own_usage(&[], pids).unwrap(), 0);
    }

    #[test]
    fn lists_combine() {
        use GpuProcessKind::*;
        let pids = OwnPids {
            outermost: 5,
            own: 5,
        };
        let list = [p(5, 100, Compute), p(5, 50, Compute), p(5, 120, Graphics)];
        assert_eq!(own_usage(&list, pids).unwrap(), 150);
        let list = [p(5, 100, Compute), p(5, 400, Graphics)];
        assert_eq!(own_usage(&list, pids).unwrap(), 400);
        let na = [GpuProcess {
            pid: 5,
            used: None,
            kind: Compute,
        }];
        assert_eq!(
            own_usage(&na, pids).unwrap_err().kind(),
            ErrorKind::Unsupported
        );
    }
}
