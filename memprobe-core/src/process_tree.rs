//! A process and all its descendants (e.g. DataLoader workers), found and
//! read cheaply at every tick.
//!
//! - [`TreeWalker`] lists the tree. The kernel lists a task's children in
//!   `/proc/<pid>/task/<tid>/children`, per thread (a child belongs to the
//!   thread that forked it). For a process whose last status read showed one
//!   thread, only its main thread's file is read, through a descriptor kept
//!   open: one `pread` instead of listing the task directory and opening a
//!   file per thread. Processes with several threads (or not read yet) get the
//!   full listing. A kernel without these files is served by scanning `/proc`
//!   for parents.
//! - [`ProcessTree`] follows the tree's processes: each one's status file is
//!   kept open (one `pread` for its resident set, high-water mark, name,
//!   parent and thread count), and a process, once seen in the tree, is
//!   followed until it exits even if it leaves the tree (reparented when its
//!   parent exits).
//! - [`ProcessTreeSampler`] is the tree's source: the sum of the resident sets.

use crate::error::{Error, Result};
use crate::process::{self, StatusFile};
use crate::procfs::{self, ProcessStatus};
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use std::collections::{HashMap, HashSet};
use std::fs::File;

/// Lists the processes of the tree below one root.
#[derive(Debug)]
pub struct TreeWalker {
    root: u32,
    /// Kept-open `task/<pid>/children` of single-threaded processes.
    main_children: HashMap<u32, File>,
    /// The kernel has no `children` files: scan `/proc` for parents instead.
    scan: bool,
}

impl TreeWalker {
    /// A walker of the tree rooted at `root`.
    pub fn new(root: u32) -> TreeWalker {
        let me = std::process::id();
        let scan = !std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists();
        TreeWalker {
            root,
            main_children: HashMap::new(),
            scan,
        }
    }

    /// The root.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// The root and all its descendants, root first, each once.
    /// `threads(pid)` is the process's thread count at its last status read,
    /// if known (1 allows the one-`pread` path); `buf` is scratch space.
    pub fn walk(&mut self, threads: impl Fn(u32) -> Option<u32>, buf: &mut Vec<u8>) -> Vec<u32> {
        let mut parents: Option<Vec<(u32, u32)>> = None;
        let mut out = vec![self.root];
        let mut seen = HashSet::from([self.root]);
        let mut i = 0;
        while i < out.len() {
            let pid = out[i];
            i += 1;
            let before = out.len();
            if self.scan {
                let table = parents.get_or_insert_with(scan_parents);
                out.extend(table.iter().filter(|(_, pp)| *pp == pid).map(|(p, _)| *p));
            } else if !(threads(pid) == Some(1) && self.read_main(pid, buf, &mut out)) {
                out.truncate(before);
                read_all_threads(pid, buf, &mut out);
            }
            // Keep each pid once (a pid has one parent, but a racing
            // reparent could list it twice).
            let mut j = before;
            while j < out.len() {
                if seen.insert(out[j]) {
                    j += 1;
                } else {
                    out.swap_remove(j);
                }
            }
        }
        out
    }

    /// Reads the main thread's children through a kept-open descriptor.
    fn read_main(&mut self, pid: u32, buf: &mut Vec<u8>, out: &mut Vec<u32>) -> bool {
        let file = match self.main_children.get(&pid) {
            Some(f) => f,
            None => match File::open(format!("/proc/{pid}/task/{pid}/children")) {
                Ok(f) => self.main_children.entry(pid).or_insert(f),
                Err(_) => return false,
            },
        };
        match procfs::read_whole(file, buf) {
            Ok(len) => {
                procfs::parse_pids(&buf[..len], out);
                true
            }
            Err(_) => {
                self.main_children.remove(&pid);
                false
            }
        }
    }

    /// Drops what is kept for a process that has exited.
    pub fn forget(&mut self, pid: u32) {
        self.main_children.remove(&pid);
    }
}

/// Children of `pid` from every thread's `children` file.
fn read_all_threads(pid: u32, buf: &mut Vec<u8>, out: &mut Vec<u32>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        if let Ok(f) = File::open(t.path().join("children")) {
            if let Ok(len) = procfs::read_whole(&f, buf) {
                procfs::parse_pids(&buf[..len], out);
            }
        }
    }
}

/// (pid, ppid) of every process in `/proc`.
fn scan_parents() -> Vec<(u32, u32)> {
    let Ok(pids) = process::all_pids() else {
        return Vec::new();
    };
    pids.into_iter()
        .filter_map(|pid| {
            let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
            // The command name may contain spaces and parentheses: split after the last ')'.
            let close = stat.iter().rposition(|&c| c == b')')?;
            let ppid = procfs::field_u64(&stat[close + 1..], 1)?;
            Some((pid, u32::try_from(ppid).ok()?))
        })
        .collect()
}

/// One reading of a [`ProcessTree`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeReading {
    /// Every live process followed, with its status: the tree's processes
    /// and those that left it since they were first seen.
    pub processes: Vec<(u32, ProcessStatus)>,
    /// Processes followed until the last reading that have exited since.
    pub exited: Vec<u32>,
}

impl TreeReading {
    /// The sum of the live processes' resident sets.
    pub fn rss(&self) -> u64 {
        self.processes.iter().map(|(_, s)| s.rss).sum()
    }
}

/// The processes of a tree, followed from reading to reading (see the
/// module's description).
#[derive(Debug)]
pub struct ProcessTree {
    walker: TreeWalker,
    /// Followed processes: the status file and the thread count last read.
    members: HashMap<u32, (StatusFile, u32)>,
    buf: Vec<u8>,
}

impl ProcessTree {
    /// The tree rooted at `root`; nothing is read until [`read`](Self::read).
    pub fn new(root: u32) -> ProcessTree {
        ProcessTree {
            walker: TreeWalker::new(root),
            members: HashMap::new(),
            buf: vec![0; 4096],
        }
    }

    /// The root.
    pub fn root(&self) -> u32 {
        self.walker.root()
    }

    /// Reads every followed process, then finds and reads newcomers.
    pub fn read(&mut self) -> TreeReading {
        let mut reading = TreeReading::default();
        let buf = &mut self.buf;
        self.members
            .retain(|&pid, (file, threads)| match file.read(buf) {
                Some(s) => {
                    *threads = s.threads;
                    reading.processes.push((pid, s));
                    true
                }
                None => {
                    reading.exited.push(pid);
                    false
                }
            });
        for &pid in &reading.exited {
            self.walker.forget(pid);
        }
        // The tree now, with thread counts just read (a single-threaded
        // process costs one read).
        let members = &self.members;
        let tree = self.walker.walk(|pid| members.get(&pid).map(|m| m.1), buf);
        for pid in tree {
            if self.members.contains_key(&pid) {
                continue;
            }
            let file = StatusFile::open(pid);
            // Exited already, or a zombie: not followed.
            if let Some(s) = file.read(buf) {
                self.members.insert(pid, (file, s.threads));
                reading.processes.push((pid, s));
            }
        }
        reading
    }
}

/// The pids of `root` and all its descendants, `root` first.
pub fn descendants(root: u32) -> Vec<u32> {
    TreeWalker::new(root).walk(|_| None, &mut Vec::new())
}

/// One process of a tree with its reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRss {
    /// Process id (as seen in this PID namespace).
    pub pid: u32,
    /// Resident set size, bytes.
    pub rss: u64,
}

/// Every live process of the tree rooted at `root` with its RSS.
pub fn tree_rss(root: u32) -> Vec<ProcessRss> {
    ProcessTree::new(root)
        .read()
        .processes
        .into_iter()
        .map(|(pid, s)| ProcessRss { pid, rss: s.rss })
        .collect()
}

/// RSS of one process from `/proc/<pid>/statm`; `None` if it is gone.
pub fn process_rss(pid: u32) -> Option<u64> {
    let text = std::fs::read(format!("/proc/{pid}/statm")).ok()?;
    procfs::field_u64(&text, 1).map(|pages| pages * procfs::page_size())
}

/// The kernel high-water mark of one process (`VmHWM`), bytes; `None` if gone.
pub fn process_hwm(pid: u32) -> Option<u64> {
    StatusFile::open(pid).read(&mut Vec::new()).map(|s| s.hwm)
}

/// Sums the RSS of a process tree ([`ProcessTree`]: processes are followed
/// until they exit). Sampled: the sum of per-process high-water marks is not
/// the high-water mark of the sum.
#[derive(Debug)]
pub struct ProcessTreeSampler {
    tree: ProcessTree,
}

impl ProcessTreeSampler {
    /// The tree rooted at this process.
    pub fn new() -> Result<Self> {
        Self::at(std::process::id())
    }

    /// The tree rooted at `root` (a zombie root is accepted: it holds no
    /// memory, its descendants may).
    pub fn at(root: u32) -> Result<Self> {
        if process_rss(root).is_none() {
            return Err(Error::unavailable(format!(
                "process {root} does not exist or /proc/{root}/statm is unreadable"
            )));
        }
        Ok(ProcessTreeSampler {
            tree: ProcessTree::new(root),
        })
    }
}

impl Sampler for ProcessTreeSampler {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "tree".into(),
            kind: SourceKind::ProcessTree,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let reading = self.tree.read();
        let root = self.tree.root();
        // A zombie root has no status memory lines but is still there (its
        // statm reads zeros): only a reaped root ends the tree.
        if !reading.processes.iter().any(|(pid, _)| *pid == root) && process_rss(root).is_none() {
            return Err(Error::unavailable(format!("process {root} has exited")));
        }
        Ok(Sample::timed(reading.rss(), t0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn finds_children_every_way() {
        let mut kids: Vec<_> = (0..2)
            .map(|_| Command::new("sleep").arg("5").spawn().unwrap())
            .collect();
        let me = std::process::id();
        let ids: Vec<u32> = kids.iter().map(std::process::Child::id).collect();
        let mut w = TreeWalker::new(me);
        let mut buf = Vec::new();
        // The test harness is multi-threaded: the full listing.
        let all = w.walk(|_| None, &mut buf);
        assert_eq!(all[0], me);
        for id in &ids {
            assert!(all.contains(id), "{all:?} lacks {id}");
        }
        // Pretending the process has one thread reads only the main
        // thread's children: still a valid, duplicate-free list.
        let main_only = w.walk(|p| (p == me).then_some(1), &mut buf);
        let unique: HashSet<_> = main_only.iter().collect();
        assert_eq!(unique.len(), main_only.len());
        // Scanning /proc for parents finds the same children.
        w.scan = true;
        let scanned = w.walk(|_| None, &mut buf);
        for id in &ids {
            assert!(scanned.contains(id), "{scanned:?} lacks {id}");
        }
        for k in &mut kids {
            k.kill().unwrap();
            k.wait().unwrap();
        }
    }

    #[test]
    fn follows_processes_until_they_exit() {
        // The tree is this test process's: tests running beside this one
        // start and end children of their own, so only `kid` is checked.
        let mut kid = Command::new("sleep").arg("5").spawn().unwrap();
        let mut tree = ProcessTree::new(std::process::id());
        let first = tree.read();
        assert!(first.processes.iter().any(|(p, _)| *p == kid.id()));
        assert!(!first.exited.contains(&kid.id()));
        assert!(first.rss() > 0);
        kid.kill().unwrap();
        kid.wait().unwrap();
        let second = tree.read();
        assert!(second.exited.contains(&kid.id()), "{:?}", second.exited);
        assert!(!second.processes.iter().any(|(p, _)| *p == kid.id()));
        assert!(!tree.read().exited.contains(&kid.id()), "reported once");
    }

    #[test]
    fn the_sampler_fails_once_the_root_is_gone() {
        let mut kid = Command::new("sleep").arg("5").spawn().unwrap();
        let mut s = ProcessTreeSampler::at(kid.id()).unwrap();
        assert!(s.read().unwrap().used > 0);
        kid.kill().unwrap();
        // Killed, not reaped yet: a zombie holds nothing.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while StatusFile::open(kid.id()).read(&mut Vec::new()).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(s.read().unwrap().used, 0, "a zombie root");
        kid.wait().unwrap();
        assert!(s.read().is_err());
        assert!(ProcessTreeSampler::at(kid.id()).is_err());
    }
}
