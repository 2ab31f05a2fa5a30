//! What `memprobe run` records: the timeline of the tree, the container and
//! each GPU, and every process's exact peak.

use memprobe_core::cgroup::CgroupVersion;
use std::collections::BTreeMap;

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
    /// Each GPU's used memory, in [`Recording::gpus`] order; `None` when
    /// that read failed.
    pub(crate) gpus: Vec<Option<u64>>,
}

impl Point {
    /// Folds `later` into `self`: the earlier time, each series' maximum.
    fn absorb(&mut self, later: &Point) {
        self.tree_rss = self.tree_rss.max(later.tree_rss);
        self.processes = self.processes.max(later.processes);
        self.cgroup = max_opt(self.cgroup, later.cgroup);
        for (a, b) in self.gpus.iter_mut().zip(&later.gpus) {
            *a = max_opt(*a, *b);
        }
    }
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
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

/// Where a process's peak figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeakSource {
    /// `VmHWM` from `/proc/<pid>/status`, last read while the process lived.
    VmHwm,
    /// `ru_maxrss` from `wait4` on the direct child: exact to its exit.
    Rusage,
}

impl PeakSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PeakSource::VmHwm => "vmhwm",
            PeakSource::Rusage => "rusage",
        }
    }
}

/// One process of the tree over its observed life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessRecord {
    pub(crate) pid: u32,
    pub(crate) ppid: Option<u32>,
    /// Command name (`/proc/<pid>/status` `Name:`), the last one seen.
    pub(crate) name: String,
    pub(crate) first_seen_ns: u64,
    pub(crate) last_seen_ns: u64,
    /// Whether the process was seen to exit before recording ended.
    pub(crate) exited: bool,
    /// The last `VmHWM` read, bytes.
    pub(crate) vmhwm: Option<u64>,
    /// The largest `VmRSS` sampled, bytes.
    pub(crate) max_sampled_rss: u64,
    /// For the direct child: `wait4`'s `ru_maxrss`, bytes.
    pub(crate) rusage_maxrss: Option<u64>,
}

impl ProcessRecord {
    /// The exact peak and where it comes from.
    pub(crate) fn peak(&self) -> (u64, PeakSource) {
        let hwm = self.vmhwm.unwrap_or(0).max(self.max_sampled_rss);
        match self.rusage_maxrss {
            Some(r) if r > hwm => (r, PeakSource::Rusage),
            _ => (hwm, PeakSource::VmHwm),
        }
    }
}

/// The container's cgroup over the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupRecord {
    pub(crate) version: CgroupVersion,
    pub(crate) path: String,
    pub(crate) limit: Option<u64>,
    pub(crate) start: Option<u64>,
    pub(crate) end: Option<u64>,
    /// The largest usage sampled, and when.
    pub(crate) sampled_peak: Option<(u64, u64)>,
    /// The kernel's high-water mark over the run (cgroup v2 `memory.peak`
    /// reset at the start), where it could be had.
    pub(crate) exact_peak: Option<u64>,
    /// Reads that failed during the run.
    pub(crate) errors: u64,
}

/// One GPU over the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuSeries {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) uuid: String,
    pub(crate) total: u64,
    /// The largest device-wide used memory sampled, and when.
    pub(crate) peak: Option<(u64, u64)>,
    /// The largest sum over the tree's processes sampled on this device.
    pub(crate) tree_peak: Option<u64>,
}

/// Everything recorded by one run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recording {
    pub(crate) timeline: Timeline,
    /// Ticks taken.
    pub(crate) samples: u64,
    /// The largest tree RSS sampled, and when.
    pub(crate) tree_peak: Option<(u64, u64)>,
    /// The most processes alive at once.
    pub(crate) max_processes: u32,
    /// Processes seen, in order of discovery (bounded: see
    /// [`MAX_PROCESS_RECORDS`]).
    pub(crate) processes: Vec<ProcessRecord>,
    /// Processes seen in all, including records dropped to stay bounded.
    pub(crate) processes_seen: u64,
    pub(crate) cgroup: Option<CgroupRecord>,
    pub(crate) gpus: Vec<GpuSeries>,
    /// Source name -> why it was not measured.
    pub(crate) unavailable: BTreeMap<String, String>,
    /// Ticks skipped because the sampler fell behind its deadlines.
    pub(crate) missed_ticks: u64,
}

/// At most this many process records are kept; beyond, the record with the
/// smallest peak among those that exited is dropped.
pub(crate) const MAX_PROCESS_RECORDS: usize = 4096;

impl Recording {
    /// The process with the largest exact peak.
    pub(crate) fn peak_process(&self) -> Option<&ProcessRecord> {
        self.processes.iter().max_by_key(|p| p.peak().0)
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

    #[test]
    fn rusage_wins_only_when_larger() {
        let mut p = ProcessRecord {
            pid: 1,
            ppid: None,
            name: "x".into(),
            first_seen_ns: 0,
            last_seen_ns: 0,
            exited: true,
            vmhwm: Some(100),
            max_sampled_rss: 90,
            rusage_maxrss: Some(50),
        };
        assert_eq!(p.peak(), (100, PeakSource::VmHwm));
        p.rusage_maxrss = Some(300);
        assert_eq!(p.peak(), (300, PeakSource::Rusage));
    }
}
