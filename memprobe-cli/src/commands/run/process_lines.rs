//! Each process of the tree over time (its resident set at every sample),
//! for the chart's per-process lines (DataLoader workers, ...), in bounded
//! memory: at most [`MAX_LINES`] processes are followed (a newcomer larger
//! than the smallest followed one replaces it) and each line is thinned to
//! at most [`MAX_POINTS`] points, neighbours merged keeping their maximum.
//!
//! A line gets a point at each sample where its process moved; a process
//! that read the same over several ticks gets, when it moves again (or
//! ends, or the run ends), one point at the last of those ticks with the
//! value it held: the same line as a point at every tick, drawn from its
//! change points.

use super::pid_map::PidMap;
use serde::Serialize;

/// Processes followed at once.
pub(crate) const MAX_LINES: usize = 64;
/// Points kept per process.
pub(crate) const MAX_POINTS: usize = 4096;

/// One process's resident set over time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) pid: u32,
    /// Its largest resident set sampled.
    pub(crate) peak: u64,
    /// (ns since spawn, bytes); each point the maximum of `merged` samples.
    points: Vec<(u64, u64)>,
    merged: u64,
    pending: Option<(u64, u64)>,
    pending_count: u64,
    /// The last sample pushed.
    last: (u64, u64),
}

impl Line {
    fn new(pid: u32) -> Line {
        Line {
            pid,
            peak: 0,
            points: Vec::new(),
            merged: 1,
            pending: None,
            pending_count: 0,
            last: (0, 0),
        }
    }

    /// The value held since the last push, as of tick `t` (unmoved since).
    fn held_until(&mut self, t: u64) {
        let (lt, lv) = self.last;
        if lt < t && (self.pending.is_some() || !self.points.is_empty()) {
            self.push(t, lv);
        }
    }

    fn push(&mut self, t: u64, rss: u64) {
        self.last = (t, rss);
        self.peak = self.peak.max(rss);
        self.pending = Some(match self.pending {
            Some((t0, v)) => (t0, v.max(rss)),
            None => (t, rss),
        });
        self.pending_count += 1;
        if self.pending_count < self.merged {
            return;
        }
        self.pending_count = 0;
        self.points.extend(self.pending.take());
        if self.points.len() >= MAX_POINTS {
            self.points = self
                .points
                .chunks(2)
                .map(|c| (c[0].0, c.iter().map(|p| p.1).max().unwrap_or(0)))
                .collect();
            self.merged *= 2;
        }
    }

    /// The points, a partly merged last one included.
    pub(crate) fn points(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.points.iter().copied().chain(self.pending)
    }
}

/// The followed processes.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessLines {
    lines: Vec<Line>,
    /// Live pid -> its line.
    live: PidMap<usize>,
    /// No followed line's peak is below this (peaks only grow), so a
    /// newcomer at or below it is turned away without a scan.
    floor: u64,
    /// Processes that had a line (evicted ones included).
    pub(crate) followed: u64,
}

impl ProcessLines {
    /// Folds in one sample of `pid` at `t` (ns since spawn) where it moved;
    /// `prev`: the tick before, until which it held its last value (`t`
    /// itself: nothing held).
    pub(crate) fn observe(&mut self, pid: u32, rss: u64, t: u64, prev: u64) {
        let at = match self.live.get(&pid) {
            Some(&i) => {
                if prev < t {
                    self.lines[i].held_until(prev);
                }
                i
            }
            None if self.lines.len() < MAX_LINES => {
                self.lines.push(Line::new(pid));
                self.followed += 1;
                self.live.insert(pid, self.lines.len() - 1);
                self.lines.len() - 1
            }
            None if rss <= self.floor => return,
            None => {
                let (i, smallest) = self
                    .lines
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, l)| l.peak)
                    .map(|(i, l)| (i, l.peak))
                    .expect("full");
                if rss <= smallest {
                    self.floor = smallest;
                    return;
                }
                let old = self.lines[i].pid;
                if self.live.get(&old) == Some(&i) {
                    self.live.remove(&old);
                }
                self.lines[i] = Line::new(pid);
                self.followed += 1;
                self.live.insert(pid, i);
                self.floor = 0;
                i
            }
        };
        self.lines[at].push(t, rss);
    }

    /// `pid` exited, alive until tick `last`: a later process with its
    /// number gets a line of its own.
    pub(crate) fn exited(&mut self, pid: u32, last: u64) {
        if let Some(i) = self.live.remove(&pid) {
            self.lines[i].held_until(last);
        }
    }

    /// The run ended at tick `last`: every live line holds its value to it.
    pub(crate) fn close(&mut self, last: u64) {
        for &i in self.live.values() {
            self.lines[i].held_until(last);
        }
    }

    /// The lines, largest peak first.
    pub(crate) fn largest(&self) -> Vec<&Line> {
        let mut v: Vec<&Line> = self.lines.iter().collect();
        v.sort_by_key(|l| (std::cmp::Reverse(l.peak), l.pid));
        v
    }
}

/// Processes drawn as lines of their own on the chart.
pub(crate) const DRAWN: usize = 16;

/// One process's line as drawn (and in the JSON's `process_lines`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DrawnLine {
    pub(crate) pid: u32,
    pub(crate) name: String,
    /// The largest RSS sampled.
    #[serde(rename = "peak_rss_bytes")]
    pub(crate) peak: u64,
    /// (seconds since spawn, bytes).
    #[serde(rename = "rss_points")]
    pub(crate) points: Vec<(f64, u64)>,
}

/// The lines the chart draws: the [`DRAWN`] largest processes.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct LinesReport {
    /// Largest peak first.
    pub(crate) lines: Vec<DrawnLine>,
    /// Processes seen in the tree.
    #[serde(rename = "processes_seen")]
    pub(crate) processes: u64,
}

/// The chart's lines, each named by `name_of` (the run's process records:
/// the recording holds these lines, so they are not read from here).
pub(crate) fn report(
    lines: &ProcessLines,
    name_of: impl Fn(u32) -> Option<String>,
    seen: u64,
) -> LinesReport {
    LinesReport {
        lines: lines
            .largest()
            .into_iter()
            .take(DRAWN)
            .map(|l| {
                let name = name_of(l.pid).unwrap_or_default();
                DrawnLine {
                    pid: l.pid,
                    name,
                    peak: l.peak,
                    points: l.points().map(|(t, v)| (t as f64 / 1e9, v)).collect(),
                }
            })
            .collect(),
        processes: seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_keep_their_peaks_and_the_largest_processes() {
        let mut pl = ProcessLines::default();
        for t in 0..10_000u64 {
            // 100 processes, process p holding p MiB, one spike.
            for p in 0..100u32 {
                let rss = if p == 3 && t == 5_000 {
                    1 << 40
                } else {
                    u64::from(p) << 20
                };
                pl.observe(1000 + p, rss, t, t.saturating_sub(1));
            }
        }
        let lines = pl.largest();
        assert_eq!(lines.len(), MAX_LINES);
        assert_eq!(lines[0].pid, 1003, "the spike's process leads");
        assert_eq!(lines[0].points().map(|p| p.1).max(), Some(1 << 40));
        assert_eq!(lines[1].pid, 1099);
        assert!(lines.iter().all(|l| l.points().count() <= MAX_POINTS + 1));
        assert!(pl.followed >= MAX_LINES as u64);
        // A reused pid after an exit starts a new line.
        pl.exited(1099, 10_000);
        pl.observe(1099, 1 << 41, 20_000, 19_999);
        assert_eq!(pl.largest()[0].points().count(), 1);
    }

    /// Fed only the ticks where the process moved, a line has the points
    /// that draw the same steps as a point at every tick.
    #[test]
    fn change_points_draw_the_same_line() {
        let v = [1u64, 1, 1, 1, 5, 5, 5, 2, 2, 2];
        let mut pl = ProcessLines::default();
        for (t, &x) in v.iter().enumerate() {
            let t = t as u64;
            if t == 0 || v[t as usize - 1] != x {
                pl.observe(7, x, t, t.saturating_sub(1));
            }
        }
        pl.exited(7, 9);
        let pts: Vec<_> = pl.largest()[0].points().collect();
        assert_eq!(pts, [(0, 1), (3, 1), (4, 5), (6, 5), (7, 2), (9, 2)]);
        // A process still alive at the end holds its value to the last tick.
        let mut pl = ProcessLines::default();
        pl.observe(8, 3, 0, 0);
        pl.close(50);
        let pts: Vec<_> = pl.largest()[0].points().collect();
        assert_eq!(pts, [(0, 3), (50, 3)]);
    }
}
