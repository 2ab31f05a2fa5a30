//! The kernel's own record of its OOM kills, from `/dev/kmsg`: the one
//! piece of evidence that names the victim. The container's `oom_kill`
//! counter says *that* a process was killed, not *which*: an unrelated
//! process of the same cgroup killed half a second before the user's own
//! `kill -9` would otherwise look like the command's OOM kill.
//!
//! The kernel writes, before it sends the victim `SIGKILL`:
//! ```text
//! oom-kill:constraint=CONSTRAINT_MEMCG,...,task_memcg=/a/b,task=grow,pid=4242,uid=0
//! Memory cgroup out of memory: Killed process 4242 (grow) total-vm:…kB, anon-rss:…kB, file-rss:…kB, shmem-rss:…kB, …
//! ```
//! Reading `/dev/kmsg` needs `CAP_SYSLOG` where `kernel.dmesg_restrict` is 1
//! (most distributions): as root it is read, otherwise the reason is kept and
//! the verdict says what it could not check. Records from before the run are
//! skipped (the reader starts at the end of the log); records the kernel
//! overwrote before they were read are counted.
//!
//! Pids are the kernel's (the initial pid namespace): inside a container
//! with its own pid namespace they do not match the run's, and no record is
//! taken as naming a process of the run unless its pid *and* its name agree.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// At most this many kill records are kept.
const MAX_KILLS: usize = 4096;

/// One OOM kill the kernel logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kill {
    /// The victim's pid, in the kernel's pid namespace.
    pub(crate) pid: u32,
    /// Its command name (up to 15 bytes, as the kernel keeps it).
    pub(crate) name: String,
    /// The record's time, µs since boot (the kernel's clock, close to
    /// `CLOCK_MONOTONIC`).
    pub(crate) at_us: u64,
    /// Its resident set when killed (anon + file + shmem), bytes, where
    /// the record gives it.
    pub(crate) rss_bytes: Option<u64>,
    /// The victim's memory cgroup, where the record gives it.
    pub(crate) memcg: Option<String>,
}

/// The reader of `/dev/kmsg`, or why there is none.
#[derive(Debug)]
pub(crate) struct KernelLog {
    file: Option<File>,
    why_not: Option<String>,
    kills: Vec<Kill>,
    /// Records the kernel overwrote before they were read.
    lost: u64,
    /// Where a record is read into, made at the first read.
    buf: Option<Box<[u8]>>,
}

impl KernelLog {
    /// Opens `/dev/kmsg` positioned at its end.
    pub(crate) fn open() -> KernelLog {
        Self::open_at("/dev/kmsg")
    }

    fn open_at(path: &str) -> KernelLog {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path);
        let (file, why_not) = match opened {
            Ok(f) => {
                // SAFETY: lseek on a descriptor we own; SEEK_END on
                // /dev/kmsg moves past every record logged so far.
                unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
                (Some(f), None)
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied => (
                None,
                Some(format!(
                    "{path} is not readable ({e}): reading the kernel's log needs CAP_SYSLOG (root) where kernel.dmesg_restrict is 1"
                )),
            ),
            Err(e) => (None, Some(format!("{path}: {e}"))),
        };
        KernelLog {
            file,
            why_not,
            kills: Vec::new(),
            lost: 0,
            buf: None,
        }
    }

    /// A reader that reads nothing (what is left once the real one was
    /// taken).
    pub(crate) fn closed() -> KernelLog {
        KernelLog {
            file: None,
            why_not: Some("not read".into()),
            kills: Vec::new(),
            lost: 0,
            buf: None,
        }
    }

    /// A second descriptor of the log, to poll for records (`None` when
    /// the log is not read).
    pub(crate) fn watch(&self) -> Option<File> {
        self.file.as_ref()?.try_clone().ok()
    }

    /// Whether the log is being read.
    pub(crate) fn readable(&self) -> bool {
        self.file.is_some()
    }

    /// Why the log is not read.
    pub(crate) fn why_not(&self) -> Option<&str> {
        self.why_not.as_deref()
    }

    /// Reads every record logged since the last call (never blocks).
    pub(crate) fn poll(&mut self) {
        let Some(f) = self.file.as_mut() else { return };
        // One record per read; the kernel's records are at most 8 KiB.
        let buf = self
            .buf
            .get_or_insert_with(|| vec![0u8; 8192].into_boxed_slice());
        loop {
            match f.read(buf) {
                Ok(0) => return,
                Ok(n) => {
                    if let Ok(record) = std::str::from_utf8(&buf[..n]) {
                        fold(&mut self.kills, record);
                    }
                }
                // Overwritten before it was read: the next read goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => self.lost += 1,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// The kills logged so far.
    pub(crate) fn kills(&self) -> &[Kill] {
        &self.kills
    }

    /// Records overwritten before they were read.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }
}

/// Folds one `/dev/kmsg` record (`prio,seq,time_us,flags;text`) into
/// `kills`: an `oom-kill:` line starts a kill (with its memory cgroup), the
/// `Killed process` line completes it (or starts one where the kernel logs
/// only that).
fn fold(kills: &mut Vec<Kill>, record: &str) {
    let Some((head, text)) = record.split_once(';') else {
        return;
    };
    let at_us = head
        .split(',')
        .nth(2)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let text = text.lines().next().unwrap_or("");
    if let Some(fields) = text.strip_prefix("oom-kill:") {
        let field = |k: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
        };
        let (Some(pid), Some(name)) = (field("pid").and_then(|p| p.parse().ok()), field("task"))
        else {
            return;
        };
        push(
            kills,
            Kill {
                pid,
                name: name.to_string(),
                at_us,
                rss_bytes: None,
                memcg: field("task_memcg").map(str::to_string),
            },
        );
        return;
    }
    let Some(rest) = text.split_once("Killed process ").map(|(_, r)| r) else {
        return;
    };
    let Some((pid, rest)) = rest.split_once(" (") else {
        return;
    };
    let Ok(pid) = pid.trim().parse::<u32>() else {
        return;
    };
    // The name may hold ") " itself: the last ") " before the figures.
    let (name, figures) = match rest.rfind(") total-vm:") {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest.trim_end_matches(')'), ""),
    };
    let kb = |k: &str| -> Option<u64> {
        let v = figures.split(k).nth(1)?;
        v.split("kB").next()?.trim().parse().ok()
    };
    let rss = match (kb("anon-rss:"), kb("file-rss:"), kb("shmem-rss:")) {
        (Some(a), f, s) => Some((a + f.unwrap_or(0) + s.unwrap_or(0)) * 1024),
        _ => None,
    };
    match kills.iter_mut().rev().take(4).find(|k| k.pid == pid) {
        Some(k) => {
            k.rss_bytes = rss;
            if k.name.is_empty() {
                k.name = name.to_string();
            }
        }
        None => push(
            kills,
            Kill {
                pid,
                name: name.to_string(),
                at_us,
                rss_bytes: rss,
                memcg: None,
            },
        ),
    }
}

fn push(kills: &mut Vec<Kill>, k: Kill) {
    if kills.len() < MAX_KILLS {
        kills.push(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as a 6.x kernel writes them for a memory cgroup's OOM kill.
    #[test]
    fn a_memcg_kill_is_read_with_its_pid_name_and_rss() {
        let mut kills = Vec::new();
        for r in [
            "6,1201,812345678,-;grow invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n",
            "6,1240,812345900,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/test,task_memcg=/test,task=grow,pid=4242,uid=0\n",
            "3,1241,812345950,-;Memory cgroup out of memory: Killed process 4242 (grow) total-vm:139880kB, anon-rss:129024kB, file-rss:1024kB, shmem-rss:0kB, UID:0 pgtables:300kB oom_score_adj:0\n",
            "6,1242,812346000,-;oom_reaper: reaped process 4242 (grow), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB\n",
        ] {
            fold(&mut kills, r);
        }
        assert_eq!(
            kills,
            vec![Kill {
                pid: 4242,
                name: "grow".into(),
                at_us: 812_345_900,
                rss_bytes: Some(130_048 * 1024),
                memcg: Some("/test".into()),
            }]
        );
    }

    /// The global OOM killer's line, alone, and a name with a parenthesis.
    #[test]
    fn a_global_kill_and_an_odd_name() {
        let mut kills = Vec::new();
        fold(
            &mut kills,
            "3,9,100,-;Out of memory: Killed process 77 (we (ird)) total-vm:10kB, anon-rss:4kB, file-rss:0kB, shmem-rss:0kB, UID:1000\n",
        );
        assert_eq!(kills.len(), 1);
        assert_eq!((kills[0].pid, kills[0].name.as_str()), (77, "we (ird)"));
        assert_eq!(kills[0].rss_bytes, Some(4096));
        fold(&mut kills, "6,10,101,-;some other line\n");
        fold(&mut kills, "garbage");
        assert_eq!(kills.len(), 1);
    }

    #[test]
    fn an_unreadable_log_says_why() {
        let l = KernelLog::open_at("/nonexistent/kmsg");
        assert!(!l.readable());
        assert!(l.why_not().unwrap().contains("/nonexistent/kmsg"));
    }
}
