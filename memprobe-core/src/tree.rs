//! A process and all its descendants (e.g. DataLoader workers): the sum of
//! their resident sets. Children are found through
//! `/proc/<pid>/task/<tid>/children`, or by scanning `/proc` where the
//! kernel lacks that file. Processes that exit mid-scan are skipped.

use crate::error::{Error, Result};
use crate::procfs;
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use std::collections::HashSet;

/// One process of a tree with its reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRss {
    /// Process id (as seen in this PID namespace).
    pub pid: u32,
    /// Resident set size, bytes.
    pub rss: u64,
}

/// The pids of `root` and all its descendants, `root` first.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut out = vec![root];
    let mut seen: HashSet<u32> = HashSet::from([root]);
    let mut i = 0;
    let mut scanned: Option<Vec<(u32, u32)>> = None;
    while i < out.len() {
        let pid = out[i];
        i += 1;
        let kids = match children_of(pid) {
            Some(k) => k,
            None => {
                let table = scanned.get_or_insert_with(scan_parents);
                table
                    .iter()
                    .filter(|(_, ppid)| *ppid == pid)
                    .map(|(p, _)| *p)
                    .collect()
            }
        };
        for k in kids {
            if seen.insert(k) {
                out.push(k);
            }
        }
    }
    out
}

/// Children of `pid` from every thread's `children` file; `None` if the
/// kernel does not provide them.
fn children_of(pid: u32) -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut kids = Vec::new();
    let mut any = false;
    for t in tasks.flatten() {
        let path = t.path().join("children");
        match std::fs::read(&path) {
            Ok(text) => {
                any = true;
                kids.extend(
                    text.split(|c| c.is_ascii_whitespace())
                        .filter_map(procfs::parse_u64)
                        .map(|v| v as u32),
                );
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && !path.parent().is_some_and(|p| p.exists()) => {}
            Err(_) => {}
        }
    }
    any.then_some(kids)
}

/// (pid, ppid) of every process in `/proc`.
fn scan_parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
            // The command name may contain spaces and parentheses: split after the last ')'.
            let close = stat.iter().rposition(|&c| c == b')')?;
            let ppid = procfs::field_u64(&stat[close + 1..], 1)?;
            Some((pid, ppid as u32))
        })
        .collect()
}

/// RSS of one process from `/proc/<pid>/statm`; `None` if it is gone.
pub fn process_rss(pid: u32) -> Option<u64> {
    let text = std::fs::read(format!("/proc/{pid}/statm")).ok()?;
    procfs::field_u64(&text, 1).map(|pages| pages * procfs::page_size())
}

/// The kernel high-water mark of one process (`VmHWM`), bytes; `None` if gone.
pub fn process_hwm(pid: u32) -> Option<u64> {
    let text = std::fs::read(format!("/proc/{pid}/status")).ok()?;
    procfs::keyed_u64(&text, b"VmHWM").map(|kb| kb * 1024)
}

/// Every process of the tree rooted at `root` with its RSS.
pub fn tree_rss(root: u32) -> Vec<ProcessRss> {
    descendants(root)
        .into_iter()
        .filter_map(|pid| {
            Some(ProcessRss {
                pid,
                rss: process_rss(pid)?,
            })
        })
        .collect()
}

/// Sums the RSS of a process tree. Sampled: the sum of per-process
/// high-water marks is not the high-water mark of the sum.
pub struct ProcessTreeSampler {
    root: u32,
}

impl ProcessTreeSampler {
    /// The tree rooted at this process.
    pub fn new() -> Result<Self> {
        Self::at(std::process::id())
    }

    /// The tree rooted at `root`.
    pub fn at(root: u32) -> Result<Self> {
        if process_rss(root).is_none() {
            return Err(Error::unavailable(format!(
                "process {root} does not exist or /proc/{root}/statm is unreadable"
            )));
        }
        Ok(ProcessTreeSampler { root })
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
        let procs = tree_rss(self.root);
        if procs.first().map(|p| p.pid) != Some(self.root) {
            return Err(Error::unavailable(format!(
                "process {} has exited",
                self.root
            )));
        }
        let used = procs.iter().map(|p| p.rss).sum();
        Ok(Sample {
            used,
            taken_at_ns: t0,
            read_ns: monotonic_ns() - t0,
            ..Sample::default()
        })
    }
}
