//! Finding the tree's processes at every tick, cheaply.
//!
//! The kernel lists a task's children in `/proc/<pid>/task/<tid>/children`,
//! per thread (a child belongs to the thread that forked it). For a process
//! whose last status read showed one thread, only its main thread's file is
//! read, through a descriptor kept open: one `pread` instead of listing the
//! task directory and opening a file per thread. Processes with several
//! threads (or not read yet) get the full listing. A kernel without these
//! files falls back to `memprobe_core::tree::descendants`, which scans
//! `/proc`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Walks the tree below one root.
#[derive(Debug)]
pub(crate) struct TreeWalker {
    root: u32,
    /// Kept-open `task/<pid>/children` of single-threaded processes.
    main_children: HashMap<u32, File>,
    /// The kernel has no `children` files: scan `/proc` instead.
    fallback: bool,
}

impl TreeWalker {
    pub(crate) fn new(root: u32) -> TreeWalker {
        let me = std::process::id();
        let fallback = !std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists();
        TreeWalker {
            root,
            main_children: HashMap::new(),
            fallback,
        }
    }

    /// The root and all its descendants, root first. `threads(pid)` is the
    /// process's thread count at its last status read, if known.
    pub(crate) fn walk(
        &mut self,
        threads: impl Fn(u32) -> Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Vec<u32> {
        if self.fallback {
            return memprobe_core::tree::descendants(self.root);
        }
        let mut out = vec![self.root];
        let mut seen = HashSet::from([self.root]);
        let mut i = 0;
        while i < out.len() {
            let pid = out[i];
            i += 1;
            let before = out.len();
            if threads(pid) == Some(1) && self.read_main(pid, buf, &mut out) {
                // done: one pread
            } else {
                out.truncate(before);
                read_all_threads(pid, buf, &mut out);
            }
            // Keep each pid once (a pid can only appear under one parent,
            // but a racing reparent could list it twice).
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
        if buf.len() < 4096 {
            buf.resize(4096, 0);
        }
        let mut len = 0;
        loop {
            match file.read_at(&mut buf[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => {
                    len += n;
                    if len < buf.len() {
                        break;
                    }
                    let grow = buf.len();
                    buf.resize(grow * 2, 0);
                }
                Err(_) => {
                    self.main_children.remove(&pid);
                    return false;
                }
            }
        }
        parse_pids(&buf[..len], out);
        true
    }

    /// Drops what is kept for a process that has exited.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.main_children.remove(&pid);
    }
}

fn read_all_threads(pid: u32, buf: &mut Vec<u8>, out: &mut Vec<u32>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        let Ok(f) = File::open(t.path().join("children")) else {
            continue;
        };
        if buf.len() < 4096 {
            buf.resize(4096, 0);
        }
        let mut len = 0;
        while let Ok(n) = f.read_at(&mut buf[len..], len as u64) {
            len += n;
            if n == 0 || len < buf.len() {
                break;
            }
            let grow = buf.len();
            buf.resize(grow * 2, 0);
        }
        parse_pids(&buf[..len], out);
    }
}

fn parse_pids(text: &[u8], out: &mut Vec<u32>) {
    out.extend(
        text.split(|c| c.is_ascii_whitespace())
            .filter_map(|w| std::str::from_utf8(w).ok()?.parse::<u32>().ok()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn finds_children_both_ways() {
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
        for k in &mut kids {
            k.kill().unwrap();
            k.wait().unwrap();
        }
    }

    #[test]
    fn parses_pid_lists() {
        let mut v = Vec::new();
        parse_pids(b"12 345 \n", &mut v);
        parse_pids(b"", &mut v);
        assert_eq!(v, vec![12, 345]);
    }
}
