//! One process's `/proc/<pid>/status`, kept open and re-read with one `pread`.
//!
//! A single read gives the name, parent, resident set (`VmRSS`, the same
//! figure as `statm`'s resident field), the kernel's high-water mark
//! (`VmHWM`) and the thread count. The descriptor is tied to the process it was opened for, not to
//! the number: once that process is gone, reads fail even if the pid is
//! reused, so a record never mixes two processes.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// What one read of `/proc/<pid>/status` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct StatusReading {
    /// `Name:`, the command name (at most 15 bytes, as the kernel keeps it).
    pub(crate) name: String,
    /// `PPid:`.
    pub(crate) ppid: Option<u32>,
    /// `VmRSS:` in bytes.
    pub(crate) rss: u64,
    /// `VmHWM:` in bytes: the peak resident set of the process's life so far.
    pub(crate) hwm: u64,
    /// `Threads:`, 0 if absent.
    pub(crate) threads: u32,
}

/// A kept-open `/proc/<pid>/status`.
#[derive(Debug)]
pub(crate) struct ProcStatus {
    pid: u32,
    file: Option<File>,
}

impl ProcStatus {
    /// Opens the status file of `pid`. When no descriptor can be had (the
    /// descriptor limit), reads fall back to opening the path each time.
    pub(crate) fn open(pid: u32) -> ProcStatus {
        ProcStatus {
            pid,
            file: File::open(format!("/proc/{pid}/status")).ok(),
        }
    }

    /// Reads the process; `None` once it has exited (a zombie has no memory
    /// lines) or cannot be read.
    pub(crate) fn read(&mut self, buf: &mut Vec<u8>) -> Option<StatusReading> {
        let text = match &self.file {
            Some(f) => read_all(f, buf)?,
            None => {
                let f = File::open(format!("/proc/{}/status", self.pid)).ok()?;
                read_all(&f, buf)?
            }
        };
        parse_status(text)
    }
}

fn read_all<'a>(f: &File, buf: &'a mut Vec<u8>) -> Option<&'a [u8]> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut len = 0;
    loop {
        let n = f.read_at(&mut buf[len..], len as u64).ok()?;
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        let grow = buf.len();
        buf.resize(grow * 2, 0);
    }
    (len > 0).then_some(&buf[..len])
}

/// Parses the fields of a status file; `None` without `VmRSS`/`VmHWM`
/// (zombies and kernel threads have no memory).
pub(crate) fn parse_status(text: &[u8]) -> Option<StatusReading> {
    let mut r = StatusReading::default();
    let (mut have_rss, mut have_hwm) = (false, false);
    for line in text.split(|&c| c == b'\n') {
        if let Some(v) = line.strip_prefix(b"Name:") {
            r.name = String::from_utf8_lossy(v.trim_ascii()).into_owned();
        } else if let Some(v) = line.strip_prefix(b"PPid:") {
            r.ppid = leading_u64(v).and_then(|p| u32::try_from(p).ok());
        } else if let Some(v) = line.strip_prefix(b"VmHWM:") {
            r.hwm = leading_u64(v)?.saturating_mul(1024);
            have_hwm = true;
        } else if let Some(v) = line.strip_prefix(b"VmRSS:") {
            r.rss = leading_u64(v)?.saturating_mul(1024);
            have_rss = true;
        } else if let Some(v) = line.strip_prefix(b"Threads:") {
            r.threads = leading_u64(v)
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(0);
            // Nothing after Threads is needed.
            break;
        }
    }
    (have_rss && have_hwm).then_some(r)
}

fn leading_u64(s: &[u8]) -> Option<u64> {
    let s = s.trim_ascii_start();
    let end = s
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(s.len());
    std::str::from_utf8(&s[..end]).ok()?.parse().ok()
}

/// The command name of `pid` from `/proc/<pid>/comm`.
pub(crate) fn comm(pid: u32) -> Option<String> {
    let text = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    Some(String::from_utf8_lossy(text.trim_ascii()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: &[u8] = b"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\n\
Ngid:\t0\nPid:\t42\nPPid:\t7\nTracerPid:\t0\nVmPeak:\t  300000 kB\nVmSize:\t  200000 kB\n\
VmLck:\t       0 kB\nVmPin:\t       0 kB\nVmHWM:\t  262144 kB\nVmRSS:\t    2048 kB\n\
RssAnon:\t    1024 kB\nThreads:\t3\nSigQ:\t0/100\n";

    #[test]
    fn live_process() {
        let r = parse_status(LIVE).unwrap();
        assert_eq!(r.name, "python3");
        assert_eq!(r.ppid, Some(7));
        assert_eq!(r.hwm, 256 << 20);
        assert_eq!(r.rss, 2 << 20);
        assert_eq!(r.threads, 3);
    }

    #[test]
    fn zombie_has_no_memory() {
        let zombie = b"Name:\tworker\nState:\tZ (zombie)\nPid:\t43\nPPid:\t42\nThreads:\t1\n";
        assert_eq!(parse_status(zombie), None);
    }

    #[test]
    fn reads_this_process() {
        let mut p = ProcStatus::open(std::process::id());
        let mut buf = Vec::new();
        let r = p.read(&mut buf).unwrap();
        assert!(r.rss > 0 && r.hwm >= r.rss, "{r:?}");
        assert!(ProcStatus::open(u32::MAX).read(&mut buf).is_none());
    }
}
