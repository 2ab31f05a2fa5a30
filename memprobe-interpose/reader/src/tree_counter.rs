//! The counter of a whole process tree: one region, `<dir>/tree`, that every
//! interposed process of the directory adds to and subtracts from at each
//! allocation and free, besides its own region.
//!
//! Why a counter of its own: the sum of the processes' peaks is only an
//! upper bound of the tree's peak (they need not peak at the same moment),
//! and summing the processes' current bytes at a reader's ticks misses what
//! happens between ticks. The tree region's `current` is the tree's bytes at
//! every instant and its marks are exact high-water marks of that sum.
//!
//! Made by the reader that owns the directory (`memprobe run --gpu-exact`,
//! a private directory per run) before the first process starts; the
//! interposer only maps an existing one, so programs preloaded outside a
//! run keep no tree. Memory the driver releases without a call (a process
//! that exits or is killed while holding memory, the old image at an
//! `exec`) leaves the tree when the process's region is *settled*: its
//! remaining bytes are subtracted once ([`FLAG_TREE_SETTLED`]): by the
//! process itself in its exit handler, by the new image after an `exec`,
//! and for a process killed or ended by `_exit`, by the reader or by a later
//! process of the tree reclaiming it.

use crate::layout::{Layout, COUNTERS, FLAG_COUNTING, FLAG_SHARED, LAYOUT_SIZE};
use crate::reader::{Error, Region};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

pub use crate::layout::FLAG_TREE_SETTLED;

/// The tree region's file name in a directory of regions (not a pid, so
/// [`processes`](crate::processes) never lists it).
pub const TREE_FILE: &str = "tree";

/// The tree region of `dir`.
pub fn tree_path(dir: &Path) -> PathBuf {
    dir.join(TREE_FILE)
}

impl Region {
    /// Creates the tree region of `dir` (the directory is created, mode
    /// 0700, if missing) and maps it. Refuses an existing one: a tree
    /// belongs to one run.
    pub fn create_tree(dir: &Path) -> Result<Arc<Region>, Error> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::Io(e)),
        }
        let path = tree_path(dir);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(Error::Io)?;
        file.set_len(LAYOUT_SIZE as u64).map_err(Error::Io)?;
        drop(file);
        // Set up through a private mapping of the file: zeroed by the kernel,
        // then initialized; the magic goes last.
        let region = Region::map_unchecked(&path)?;
        let me = std::process::id();
        region.layout().init(
            me,
            crate::liveness::start_time(me),
            FLAG_COUNTING | FLAG_SHARED,
        );
        Ok(region)
    }

    /// The tree region of `dir`, if a run made one.
    pub fn open_tree(dir: &Path) -> Result<Arc<Region>, Error> {
        Region::open_path(&tree_path(dir))
    }
}

/// Subtracts from `tree` what a process that ended still held (the driver
/// freed it without a call), once per region whoever calls it; returns
/// whether this call did it.
pub fn settle(tree: &Layout, ended: &Layout) -> bool {
    let before = ended.header.flags.fetch_or(FLAG_TREE_SETTLED, SeqCst);
    if before & FLAG_TREE_SETTLED != 0 {
        return false;
    }
    for i in 0..COUNTERS {
        let held = ended.counters[i].current.load(SeqCst);
        if held > 0 {
            tree.sub(i, held);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_made_once_and_settling_subtracts_once() {
        let dir = std::env::temp_dir().join(format!("memprobe-tree-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tree = Region::create_tree(&dir).unwrap();
        assert!(Region::create_tree(&dir).is_err());
        let again = Region::open_tree(&dir).unwrap();
        tree.layout().add(0, 300);
        assert_eq!(again.current(crate::Counter::Device(0)), 300);
        // SAFETY: every field is an atomic integer, valid when zeroed.
        let ended: Box<Layout> = unsafe { Box::new(std::mem::zeroed()) };
        ended.init(1, 1, FLAG_COUNTING);
        ended.add(0, 100);
        assert!(settle(tree.layout(), &ended));
        assert!(!settle(tree.layout(), &ended));
        assert_eq!(tree.current(crate::Counter::Device(0)), 200);
        assert_eq!(tree.read(crate::Counter::Device(0)).lifetime_peak, 300);
        assert!(crate::processes(&dir).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn in_a_tree_directory_ended_processes_are_settled_not_removed() {
        let dir =
            std::env::temp_dir().join(format!("memprobe-tree-reclaim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tree = Region::create_tree(&dir).unwrap();
        // The region of a process that no longer exists (beyond pid_max),
        // which ended holding 100 bytes.
        let pid = 0x7fff_fff0u32;
        let path = crate::region_path(&dir, pid);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(LAYOUT_SIZE as u64).unwrap();
        drop(f);
        let ended = Region::map_unchecked(&path).unwrap();
        ended.layout().init(pid, 1, FLAG_COUNTING | FLAG_SHARED);
        ended.layout().add(0, 100);
        tree.layout().add(0, 100);
        tree.layout().add(0, 40); // a live process's
        assert_eq!(crate::reclaim_dead(&dir).unwrap(), 0);
        assert!(path.exists(), "kept for the run's reader");
        assert_eq!(tree.current(crate::Counter::Device(0)), 40);
        // Once only.
        assert_eq!(crate::reclaim_dead(&dir).unwrap(), 0);
        assert!(!settle(tree.layout(), ended.layout()));
        assert_eq!(tree.current(crate::Counter::Device(0)), 40);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
