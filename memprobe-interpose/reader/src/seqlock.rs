//! The reader's side of a breakdown the writer rewrites under a sequence
//! count (odd while it writes): the origins' and the stacks' peaks are
//! copied the same way, so the retry rules live here once.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};

/// Tries before a reader gives up on a writer that keeps rewriting.
const TRIES: usize = 1000;

/// One consistent copy of a breakdown.
pub(crate) struct Copied {
    /// The sequence count it was read at (0: never written).
    pub(crate) seq: u32,
    pub(crate) total: u64,
    pub(crate) at_ns: u64,
    pub(crate) bytes: Vec<u64>,
}

/// `total`, `at_ns` and `bytes` as one writer left them, or `None` when a
/// writer was rewriting them at every try.
pub(crate) fn read(
    seq: &AtomicU32,
    total: &AtomicU64,
    at_ns: &AtomicU64,
    bytes: &[AtomicU64],
) -> Option<Copied> {
    for _ in 0..TRIES {
        let s = seq.load(Acquire);
        if s % 2 == 1 {
            std::thread::yield_now();
            continue;
        }
        let copy = Copied {
            seq: s,
            total: total.load(Relaxed),
            at_ns: at_ns.load(Relaxed),
            bytes: bytes.iter().map(|x| x.load(Relaxed)).collect(),
        };
        // The loads above must not pass the second read of the count.
        fence(Acquire);
        if seq.load(Relaxed) == s {
            return Some(copy);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_that_never_finishes_gives_none_and_a_finished_one_its_values() {
        let (seq, total, at) = (AtomicU32::new(3), AtomicU64::new(7), AtomicU64::new(9));
        let bytes = [AtomicU64::new(1), AtomicU64::new(6)];
        assert!(read(&seq, &total, &at, &bytes).is_none());
        seq.store(4, Relaxed);
        let c = read(&seq, &total, &at, &bytes).unwrap();
        assert_eq!((c.seq, c.total, c.at_ns, c.bytes), (4, 7, 9, vec![1, 6]));
    }
}
