//! The tree's PSS and USS: `/proc/<pid>/smaps_rollup` summed over a process
//! and its descendants.
//!
//! Summed RSS counts a page once in every process that maps it: DataLoader
//! workers forked from a trainer share its pages copy-on-write, and a tree of
//! a 0.8 GiB parent and four workers can show 2.75 GiB of "RSS" it never
//! held. PSS divides each shared page among the processes sharing it, so the
//! tree's PSS counts every page of the tree once; USS counts only the pages
//! private to each process (what ending a worker would give back).
//!
//! Costly, hence opt-in: the kernel walks every mapping of every process at
//! each read (milliseconds for a process of several GiB). Each process's
//! file is kept open between reads; it is reopened when the process has
//! replaced its image (`exec`), since an open `smaps_rollup` belongs to the
//! address space it was opened on.
//!
//! A reading is not one atomic snapshot: the processes are read one after
//! the other. When a process exits after it was read, the pages it shared
//! are divided among fewer processes in later reads, and the sum counts
//! them more than once (DataLoader workers ending at an epoch's end could
//! add a third of the tree's real size). So after a pass every process read
//! is checked to still hold its address space (one `pread` of its kept-open
//! `statm`); a pass that saw a process end is read again once, and reported
//! as unsettled if it saw one end again. (A process forked during a pass is
//! not read and makes its parent's share smaller: the sum can only fall
//! short, never overshoot.)

use crate::error::{Error, ErrorKind, Result};
use crate::process_tree::{process_rss, ProcessTree};
use crate::procfs;
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use crate::smaps::{SmapsMetric, SmapsRollup};
use std::collections::HashMap;
use std::fs::File;

/// One process's figures in a [`TreeSmapsReading`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSmaps {
    /// Process id.
    pub pid: u32,
    /// Its PSS and USS.
    pub rollup: SmapsRollup,
}

/// One reading of the PSS and USS of a set of processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSmapsReading {
    /// The sum of the processes' PSS, bytes: every page of the set once.
    pub pss: u64,
    /// The sum of the processes' USS, bytes.
    pub uss: u64,
    /// The processes read, in the order asked.
    pub processes: Vec<ProcessSmaps>,
    /// Processes asked for that were gone (exited, or zombies holding no
    /// memory) by the time their file was read: skipped.
    pub vanished: u32,
    /// No process of the set ended during the reading (see the module's
    /// description). When false, the sums may count pages shared with an
    /// ending process more than once.
    pub settled: bool,
    /// Passes over the set this reading took (2 when the first was unsettled).
    pub passes: u32,
}

/// Reads `smaps_rollup` of many processes, keeping each one's file open.
#[derive(Debug, Default)]
pub struct SmapsReader {
    /// pid -> its open files and the last round that asked for it.
    files: HashMap<u32, Kept>,
    round: u64,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Kept {
    smaps: File,
    /// Reads zeros once the process has released its address space, and
    /// fails once it is reaped: the check that a pass was settled.
    statm: Option<File>,
    round: u64,
}

/// What reading one process gave.
enum One {
    Read(SmapsRollup),
    Gone,
}

impl SmapsReader {
    /// A reader with no file open yet.
    pub fn new() -> SmapsReader {
        SmapsReader::default()
    }

    /// Reads every process of `pids` and sums them. Processes that vanish
    /// before or while their file is read are skipped and counted in
    /// [`TreeSmapsReading::vanished`]; files of processes not asked for any
    /// more are closed.
    ///
    /// # Errors
    /// [`ErrorKind::PermissionDenied`] when a process's file may not be read
    /// (another user's process: reading it needs ptrace read access), with
    /// the pid in the message; [`ErrorKind::Parse`] for a malformed file.
    pub fn read(&mut self, pids: impl IntoIterator<Item = u32>) -> Result<TreeSmapsReading> {
        self.round += 1;
        let pids: Vec<u32> = pids.into_iter().collect();
        let mut out = self.pass(&pids)?;
        if !out.settled {
            // Once more: the processes still alive, in a calmer moment.
            let again: Vec<u32> = out.processes.iter().map(|p| p.pid).collect();
            let vanished = out.vanished;
            out = self.pass(&again)?;
            out.vanished += vanished;
            out.passes = 2;
        }
        let round = self.round;
        self.files.retain(|_, k| k.round == round);
        Ok(out)
    }

    /// One pass over `pids`, then the check that none of them ended meanwhile.
    fn pass(&mut self, pids: &[u32]) -> Result<TreeSmapsReading> {
        let mut out = TreeSmapsReading {
            passes: 1,
            ..TreeSmapsReading::default()
        };
        for &pid in pids {
            match self.read_one(pid)? {
                One::Read(rollup) => {
                    out.pss += rollup.pss;
                    out.uss += rollup.uss;
                    out.processes.push(ProcessSmaps { pid, rollup });
                }
                One::Gone => out.vanished += 1,
            }
        }
        // A process found gone may have ended after another one was read.
        out.settled = out.vanished == 0
            && out
                .processes
                .iter()
                .all(|p| self.holds_memory(p.pid).unwrap_or(true));
        Ok(out)
    }

    /// Whether `pid` still has its address space: `statm` reads a non-zero
    /// size; `None` when that cannot be told (no `statm` kept open).
    fn holds_memory(&mut self, pid: u32) -> Option<bool> {
        let statm = self.files.get(&pid)?.statm.as_ref()?;
        Some(match procfs::read_whole(statm, &mut self.buf) {
            Ok(len) => procfs::field_u64(&self.buf[..len], 0).is_some_and(|size| size > 0),
            Err(_) => false,
        })
    }

    /// Number of files kept open.
    pub fn open_files(&self) -> usize {
        self.files.len()
    }

    fn read_one(&mut self, pid: u32) -> Result<One> {
        if let Some(kept) = self.files.get_mut(&pid) {
            kept.round = self.round;
            match procfs::read_whole(&kept.smaps, &mut self.buf) {
                Ok(len) => return parse(pid, &self.buf[..len]),
                // ESRCH: the address space the file was opened on is gone:
                // the process exited, or exec'd a new image (reopen below).
                Err(e) if gone(&e) => {
                    self.files.remove(&pid);
                }
                Err(e) => return Err(read_error(pid, &e)),
            }
        }
        let file = match File::open(format!("/proc/{pid}/smaps_rollup")) {
            Ok(f) => f,
            Err(e) if gone(&e) => return Ok(One::Gone),
            Err(e) => return Err(read_error(pid, &e)),
        };
        let got = match procfs::read_whole(&file, &mut self.buf) {
            Ok(len) => parse(pid, &self.buf[..len])?,
            Err(e) if gone(&e) => return Ok(One::Gone),
            Err(e) => return Err(read_error(pid, &e)),
        };
        if let One::Read(_) = got {
            let statm = File::open(format!("/proc/{pid}/statm")).ok();
            self.files.insert(
                pid,
                Kept {
                    smaps: file,
                    statm,
                    round: self.round,
                },
            );
        }
        Ok(got)
    }
}

/// The process (or its address space) no longer exists.
fn gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH))
}

fn read_error(pid: u32, e: &std::io::Error) -> Error {
    if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        return Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "cannot read /proc/{pid}/smaps_rollup: {e} (a process's PSS/USS is readable by \
                 its own user, or with CAP_SYS_PTRACE)"
            ),
        );
    }
    Error::io(format_args!("read /proc/{pid}/smaps_rollup"), e)
}

/// An empty file is a process without an address space (a zombie between
/// two reads, a kernel thread): nothing to count.
fn parse(pid: u32, text: &[u8]) -> Result<One> {
    if text.is_empty() {
        return Ok(One::Gone);
    }
    SmapsRollup::parse(text).map(One::Read).ok_or_else(|| {
        Error::new(
            ErrorKind::Parse,
            format!("/proc/{pid}/smaps_rollup: missing Pss/Private lines"),
        )
    })
}

/// The PSS or USS of a process tree: the sum over its live processes (found
/// and followed by [`ProcessTree`]) of their `smaps_rollup`. Sampled.
#[derive(Debug)]
pub struct TreeSmapsSampler {
    tree: ProcessTree,
    reader: SmapsReader,
    metric: SmapsMetric,
}

impl TreeSmapsSampler {
    /// The tree rooted at this process.
    pub fn new(metric: SmapsMetric) -> Result<Self> {
        Self::at(std::process::id(), metric)
    }

    /// The tree rooted at `root`.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when `root` does not exist or the kernel
    /// has no `smaps_rollup` (Linux < 4.14); the errors of a first read
    /// ([`SmapsReader::read`]) otherwise.
    pub fn at(root: u32, metric: SmapsMetric) -> Result<Self> {
        if process_rss(root).is_none() {
            return Err(Error::unavailable(format!(
                "process {root} does not exist or /proc/{root}/statm is unreadable"
            )));
        }
        if !std::path::Path::new("/proc/self/smaps_rollup").exists() {
            return Err(Error::unavailable(
                "/proc/self/smaps_rollup does not exist (Linux 4.14 or later is needed)",
            ));
        }
        let mut s = TreeSmapsSampler {
            tree: ProcessTree::new(root),
            reader: SmapsReader::new(),
            metric,
        };
        s.read_tree()?;
        Ok(s)
    }

    /// The tree's PSS and USS now, with each process's figures.
    pub fn read_tree(&mut self) -> Result<TreeSmapsReading> {
        let reading = self.tree.read();
        let root = self.tree.root();
        if !reading.processes.iter().any(|(pid, _)| *pid == root) && process_rss(root).is_none() {
            return Err(Error::unavailable(format!("process {root} has exited")));
        }
        self.reader
            .read(reading.processes.iter().map(|(pid, _)| *pid))
    }
}

impl Sampler for TreeSmapsSampler {
    fn info(&self) -> SourceInfo {
        let (name, kind) = match self.metric {
            SmapsMetric::Pss => ("tree_pss", SourceKind::ProcessTreePss),
            SmapsMetric::Uss => ("tree_uss", SourceKind::ProcessTreeUss),
        };
        SourceInfo {
            name: name.into(),
            kind,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let r = self.read_tree()?;
        let used = match self.metric {
            SmapsMetric::Pss => r.pss,
            SmapsMetric::Uss => r.uss,
        };
        Ok(Sample::timed(used, t0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn vanished_processes_are_skipped_and_their_files_closed() {
        let mut kid = Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id();
        let mut r = SmapsReader::new();
        let first = r.read([me, kid.id()]).unwrap();
        assert_eq!(first.processes.len(), 2, "{first:?}");
        assert_eq!((first.vanished, first.passes), (0, 1));
        assert!(first.settled);
        assert!(first.pss > 0 && first.uss > 0 && first.uss <= first.pss);
        assert_eq!(r.open_files(), 2);
        kid.kill().unwrap();
        kid.wait().unwrap();
        // Reaped: the kept file reads ESRCH and the path is gone.
        let second = r.read([me, kid.id()]).unwrap();
        assert_eq!(second.processes.len(), 1);
        // The first pass found the child gone, so it was not settled; the
        // second pass read only this process.
        assert_eq!((second.passes, second.vanished), (2, 1));
        assert!(second.settled);
        assert_eq!(r.open_files(), 1);
        // A pid no longer asked for has its file closed.
        let third = r.read([]).unwrap();
        assert_eq!((third.pss, third.vanished, third.passes), (0, 0, 1));
        assert!(third.settled);
        assert_eq!(r.open_files(), 0);
    }

    #[test]
    fn a_process_that_released_its_memory_is_seen_ending() {
        let mut kid = Command::new("sleep").arg("5").spawn().unwrap();
        let mut r = SmapsReader::new();
        r.read([kid.id()]).unwrap();
        assert_eq!(r.holds_memory(kid.id()), Some(true));
        kid.kill().unwrap();
        // A zombie (not reaped yet) has released its address space.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while r.holds_memory(kid.id()) != Some(false) {
            assert!(std::time::Instant::now() < deadline, "still holds memory");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        kid.wait().unwrap();
        assert_eq!(r.holds_memory(kid.id()), Some(false), "reaped");
        assert_eq!(r.holds_memory(1 << 30), None, "never read");
    }

    #[test]
    fn permission_problems_say_what_is_needed() {
        let e = read_error(42, &std::io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.message().contains("/proc/42/smaps_rollup"), "{e}");
        assert!(e.message().contains("CAP_SYS_PTRACE"), "{e}");
        // Unprivileged, init's file is another user's: the real refusal.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            let err = SmapsReader::new().read([1]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        }
    }

    #[test]
    fn a_process_that_execs_is_read_again() {
        // The child exists before exec (a copy of this process), then execs
        // sleep: the kept file is bound to the old image and must be reopened.
        let mut kid = Command::new("sh")
            .arg("-c")
            .arg("read x; exec sleep 5")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = kid.id();
        let mut r = SmapsReader::new();
        let before = r.read([pid]).unwrap();
        assert_eq!(before.processes.len(), 1);
        use std::io::Write;
        kid.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/exe"))
            .map_or(true, |p| !p.to_string_lossy().contains("sleep"))
        {
            assert!(std::time::Instant::now() < deadline, "never exec'd");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let after = r.read([pid]).unwrap();
        assert_eq!(after.processes.len(), 1, "{after:?}");
        assert_eq!(after.vanished, 0);
        kid.kill().unwrap();
        kid.wait().unwrap();
    }

    #[test]
    fn the_sampler_names_its_kind_and_fails_once_the_root_is_gone() {
        let mut kid = Command::new("sleep").arg("5").spawn().unwrap();
        let mut s = TreeSmapsSampler::at(kid.id(), SmapsMetric::Uss).unwrap();
        assert_eq!(s.info().kind, SourceKind::ProcessTreeUss);
        assert_eq!(s.info().name, "tree_uss");
        assert!(s.read().unwrap().used > 0);
        kid.kill().unwrap();
        kid.wait().unwrap();
        assert_eq!(s.read().unwrap_err().kind(), ErrorKind::Unavailable);
        assert!(TreeSmapsSampler::at(kid.id(), SmapsMetric::Pss).is_err());
    }
}
