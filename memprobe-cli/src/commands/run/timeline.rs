//! The bounded timeline of `memprobe run`: one point per sample (the tree,
//! the container, each GPU), thinned on long runs without losing a peak.

/// The timeline keeps at most this many points; a longer run is thinned by
/// merging neighbouring pairs (each series keeps its maximum), so memory and
/// output sizes stay bounded while no peak disappears.
pub(crate) const MAX_POINTS: usize = 100_000;

/// One point of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Point {
    /// Nanoseconds since the child was spawned.
    pub(crate) t_ns: u64,
    /// Sum of the resident sets of the tree's live processes.
    pub(crate) tree_rss: u64,
    /// Live processes in the tree.
    pub(crate) processes: u32,
    /// The cgroup's usage; `None` without a cgroup or when the read failed.
    pub(crate) cgroup: Option<u64>,
    /// Each GPU's used memory, in [`Recording::gpus`](crate::commands::run::recording::Recording::gpus) order; `None` when
    /// that read failed.
    pub(crate) gpus: Vec<Option<u64>>,
    /// With `--gpu-exact`: per device ordinal, the tree's exact peak since
    /// the previous point (empty until a device is used).
    pub(crate) gpu_exact: Vec<u64>,
    /// With `--pss`: the tree's PSS and USS; `None` when not read or the
    /// read failed.
    pub(crate) tree_pss: Option<u64>,
    pub(crate) tree_uss: Option<u64>,
}

impl Point {
    /// Folds `later` into `self`: the earlier time, each series' maximum.
    fn absorb(&mut self, later: &Point) {
        self.tree_rss = self.tree_rss.max(later.tree_rss);
        self.processes = self.processes.max(later.processes);
        self.cgroup = max_opt(self.cgroup, later.cgroup);
        self.tree_pss = max_opt(self.tree_pss, later.tree_pss);
        self.tree_uss = max_opt(self.tree_uss, later.tree_uss);
        for (a, b) in self.gpus.iter_mut().zip(&later.gpus) {
            *a = max_opt(*a, *b);
        }
        if later.gpu_exact.len() > self.gpu_exact.len() {
            self.gpu_exact.resize(later.gpu_exact.len(), 0);
        }
        for (a, b) in self.gpu_exact.iter_mut().zip(&later.gpu_exact) {
            *a = (*a).max(*b);
        }
    }
}

/// The larger of two optional readings (`None` when both are).
pub(crate) fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// A bounded timeline (see [`MAX_POINTS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Timeline {
    points: Vec<Point>,
    /// Raw samples per stored point (a power of two).
    merged: u64,
    /// Raw samples folded into `pending` so far.
    pending_count: u64,
    pending: Option<Point>,
    max_points: usize,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::with_capacity(MAX_POINTS)
    }
}

impl Timeline {
    /// A timeline holding at most `max_points` (at least 2) points.
    pub(crate) fn with_capacity(max_points: usize) -> Self {
        Timeline {
            points: Vec::new(),
            merged: 1,
            pending_count: 0,
            pending: None,
            max_points: max_points.max(2),
        }
    }

    /// Appends one raw sample.
    pub(crate) fn push(&mut self, p: Point) {
        match &mut self.pending {
            Some(acc) => acc.absorb(&p),
            None => self.pending = Some(p),
        }
        self.pending_count += 1;
        if self.pending_count < self.merged {
            return;
        }
        self.pending_count = 0;
        if let Some(done) = self.pending.take() {
            self.points.push(done);
        }
        if self.points.len() >= self.max_points {
            self.halve();
        }
    }

    fn halve(&mut self) {
        let old = std::mem::take(&mut self.points);
        let mut it = old.into_iter();
        while let Some(mut a) = it.next() {
            if let Some(b) = it.next() {
                a.absorb(&b);
            }
            self.points.push(a);
        }
        self.merged *= 2;
    }

    /// The points, including a partly merged last one.
    pub(crate) fn points(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().chain(self.pending.iter())
    }

    /// How many points [`points`](Self::points) yields.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.points.len() + usize::from(self.pending.is_some())
    }

    /// Raw samples per point: 1 unless the run was long enough to be thinned.
    pub(crate) fn merged(&self) -> u64 {
        self.merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(t: u64, v: u64) -> Point {
        Point {
            t_ns: t,
            tree_rss: v,
            processes: 1,
            cgroup: Some(v * 2),
            gpus: vec![None, Some(v)],
            gpu_exact: if t % 2 == 0 { vec![v] } else { vec![0, v] },
            tree_pss: (t % 3 != 0).then_some(v / 2),
            tree_uss: Some(v / 4),
        }
    }

    #[test]
    fn thinning_keeps_peaks_and_bounds() {
        let mut tl = Timeline::with_capacity(8);
        for i in 0..100 {
            let v = if i == 37 { 1_000 } else { i };
            tl.push(pt(i, v));
        }
        assert!(tl.len() <= 8, "{}", tl.len());
        assert!(tl.merged() >= 16);
        let max = tl.points().map(|p| p.tree_rss).max().unwrap();
        assert_eq!(max, 1_000);
        assert_eq!(tl.points().map(|p| p.cgroup).max().unwrap(), Some(2_000));
        assert_eq!(tl.points().map(|p| p.gpus[1]).max().unwrap(), Some(1_000));
        assert_eq!(tl.points().map(|p| p.tree_pss).max().unwrap(), Some(500));
        assert_eq!(tl.points().map(|p| p.tree_uss).max().unwrap(), Some(250));
        // The exact series keeps its peaks too, and grows to every device.
        assert!(tl.points().all(|p| p.gpu_exact.len() == 2));
        assert_eq!(tl.points().map(|p| p.gpu_exact[1]).max().unwrap(), 1_000);
        let times: Vec<u64> = tl.points().map(|p| p.t_ns).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
        assert_eq!(times[0], 0);
    }

    #[test]
    fn short_runs_are_untouched() {
        let mut tl = Timeline::default();
        for i in 0..10 {
            tl.push(pt(i, i));
        }
        assert_eq!(tl.len(), 10);
        assert_eq!(tl.merged(), 1);
    }
}
