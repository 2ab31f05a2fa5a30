//! The folded peaks of a source's open windows, kept per cohort so that a
//! boundary costs the same with 1 or 1024 windows open.
//!
//! A boundary folds the high-water mark into the peak of every open window
//! of its source. Windows whose folded peaks are equal stay equal from then
//! on (every later fold raises them alike), so they share one cohort, and a
//! fold raises each cohort, not each window. After a fold every cohort that
//! was at or below the mark holds the mark: neighbours that became equal
//! merge, so a source keeps a handful of cohorts however many windows it
//! has (one per distinct peak still above the later marks).
//!
//! Cohorts are ordered by creation; a window holds an id, and its cohort is
//! the last one created at or before that id (merging keeps the older id).

/// One group of windows with the same folded peak.
#[derive(Debug, Clone, Copy)]
struct Cohort {
    /// The lowest id of the windows in it.
    first: u64,
    peak: u64,
    members: usize,
}

/// The cohorts of one source.
#[derive(Debug, Default)]
pub(crate) struct Cohorts {
    list: Vec<Cohort>,
    next: u64,
}

impl Cohorts {
    /// A window joins with its interval's first peak; returns its id.
    pub(crate) fn join(&mut self, peak: u64) -> u64 {
        if let Some(last) = self.list.last_mut() {
            if last.peak == peak {
                last.members += 1;
                return last.first;
            }
        }
        let id = self.next;
        self.next += 1;
        self.list.push(Cohort {
            first: id,
            peak,
            members: 1,
        });
        id
    }

    fn index(&self, id: u64) -> usize {
        self.list.partition_point(|c| c.first <= id) - 1
    }

    /// The folded peak of window `id`.
    pub(crate) fn peak(&self, id: u64) -> u64 {
        self.list[self.index(id)].peak
    }

    /// Window `id` leaves (closed, or restarted into a new cohort).
    pub(crate) fn leave(&mut self, id: u64) {
        let i = self.index(id);
        self.list[i].members -= 1;
        if self.list[i].members == 0 {
            // Its ids now fall in the previous cohort: no window holds one.
            self.list.remove(i);
        }
    }

    /// Folds `hwm` into every window's peak.
    pub(crate) fn raise(&mut self, hwm: u64) {
        for c in &mut self.list {
            c.peak = c.peak.max(hwm);
        }
        self.list.dedup_by(|later, earlier| {
            if later.peak == earlier.peak {
                earlier.members += later.members;
                true
            } else {
                false
            }
        });
    }

    /// How many cohorts there are (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_reach_every_window_and_equal_peaks_merge() {
        let mut c = Cohorts::default();
        let a = c.join(10);
        let b = c.join(30);
        let d = c.join(20);
        assert_eq!((c.peak(a), c.peak(b), c.peak(d)), (10, 30, 20));
        c.raise(25);
        assert_eq!((c.peak(a), c.peak(b), c.peak(d)), (25, 30, 25));
        assert_eq!(c.len(), 3, "only neighbours merge");
        c.raise(30);
        assert_eq!((c.peak(a), c.peak(b), c.peak(d)), (30, 30, 30));
        assert_eq!(c.len(), 1);
        // One leaves: the others keep their peak, and later folds.
        c.leave(b);
        let e = c.join(5);
        c.raise(7);
        assert_eq!((c.peak(a), c.peak(d), c.peak(e)), (30, 30, 7));
        c.leave(a);
        c.leave(d);
        assert_eq!(c.peak(e), 7);
        c.leave(e);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn many_windows_at_one_level_share_one_cohort() {
        let mut c = Cohorts::default();
        let ids: Vec<u64> = (0..1024).map(|i| c.join(100 + i % 2)).collect();
        c.raise(101);
        assert_eq!(c.len(), 1);
        assert!(ids.iter().all(|&i| c.peak(i) == 101));
    }

    /// Against the plain model (one peak per window, every fold raising
    /// each): random joins, leaves and folds.
    #[test]
    fn matches_one_peak_per_window() {
        let mut c = Cohorts::default();
        let mut model: Vec<(u64, u64)> = Vec::new(); // (id, peak)
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20_000 {
            match rand(3) {
                0 => {
                    let p = rand(50);
                    model.push((c.join(p), p));
                }
                1 if !model.is_empty() => {
                    let k = rand(model.len() as u64) as usize;
                    c.leave(model.swap_remove(k).0);
                }
                _ => {
                    let h = rand(50);
                    c.raise(h);
                    for w in &mut model {
                        w.1 = w.1.max(h);
                    }
                }
            }
            for &(id, p) in &model {
                assert_eq!(c.peak(id), p);
            }
        }
    }
}
