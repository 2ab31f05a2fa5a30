//! Reclaiming the regions of processes that ended: their files removed, or
//! in a run's directory, what they still held settled into the tree's
//! counter.

use crate::reader::{processes, Region};
use crate::tree_counter;
use std::io;
use std::path::Path;

/// Removes the region files in `dir` of processes that ended (or whose pid
/// was reused), except those a live reader still holds a mark in; returns
/// how many were removed.
///
/// In a directory with a tree region ([`crate::tree_counter`]) nothing is removed:
/// the run's reader reads every process's final counts and removes the
/// files itself; what the ended processes still held is taken out of the
/// tree's counter ([`crate::tree_counter::settle`]).
pub fn reclaim_dead(dir: &Path) -> io::Result<usize> {
    if let Ok(tree) = Region::open_tree(dir) {
        for e in processes(dir)? {
            if !e.alive {
                if let Ok(r) = Region::open_path(&e.path) {
                    tree_counter::settle(tree.layout(), r.layout());
                }
            }
        }
        return Ok(0);
    }
    let mut n = 0;
    for e in processes(dir)? {
        if e.alive {
            continue;
        }
        let held = Region::open_path(&e.path).is_ok_and(|r| r.layout().held_by_live_reader());
        if !held && std::fs::remove_file(&e.path).is_ok() {
            n += 1;
        }
    }
    Ok(n)
}
