//! `memprobe run --gpu-exact`: what held the *tree's* GPU memory, by origin,
//! at the tree's exact peak and at each phase's peak.
//!
//! The interposer keeps one breakdown per process, copied at the very
//! allocation that raised that process's peak. The tree's peak is a sum
//! over processes at one instant, and no process sees the others' origins,
//! so the run finds the tree's breakdown in one of two ways, each exact:
//!
//! - **One process held it all.** When the tree's peak on a device equals
//!   one process's own peak there, every other process held nothing there
//!   at that process's peak (the tree, at that instant, held at least that
//!   process's peak, and never more than its own peak): the process's
//!   breakdown *is* the tree's. This is the usual case (one trainer per
//!   GPU) and costs nothing.
//! - **Seen whole at a tick.** At a tick where the tree holds exactly the
//!   highest it held since the tick before (its counter's current bytes
//!   equal the interval's exact peak), the run reads every process's live
//!   bytes by origin and keeps them if the tree's counter did not move
//!   while it read and the processes' bytes sum to it: a moment at which
//!   the tree held that interval's peak, split by origin. Consecutive ticks
//!   with the same split extend one *span* rather than adding one.
//!
//! A tree peak or a phase peak that was neither (a spike of several
//! processes at once between two ticks) has no breakdown, and says why:
//! exact or unknown, never a guess.
//!
//! Costs: each tick reads the tree counter's current bytes per device (one
//! load); only where it stands at its interval's peak are the processes'
//! 64 live counters per device loaded (no names, no allocation), and only
//! when they differ from the open span are the origins' names read.
//! Bounded: at most [`MAX_SPANS`] spans per device; past that, only spans
//! above every one kept (so the tree's own peak keeps its breakdown), the
//! others counted in [`Spans::dropped`]; a span has at most
//! [`MAX_LINES`] origin lines (the rest in one "other origins" line).

use crate::commands::run::gpu_origins::{named, OriginLine, OriginsAtPeak};
use memprobe_interpose_reader::origins::{PeakOrigins, MAX_ORIGINS, OVERFLOW_LIBRARY};
use memprobe_interpose_reader::{Counter, Region};
use serde::Serialize;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// Spans kept per device.
pub(crate) const MAX_SPANS: usize = 4096;
/// Origin lines kept per span, merged over the processes.
pub(crate) const MAX_LINES: usize = 64;

/// Ticks at which the tree was seen whole at its interval's peak with one
/// split by origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Span {
    /// The first and last tick of the span, `CLOCK_MONOTONIC` ns (placed
    /// on the run's timeline when recording ends).
    pub(crate) first_ns: u64,
    pub(crate) last_ns: u64,
    /// The tree's bytes at each of those ticks (the sum of `by_origin`).
    pub(crate) total: u64,
    /// Merged over the processes by library and symbol, largest first.
    pub(crate) by_origin: Vec<OriginLine>,
}

/// One device's spans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Spans {
    pub(crate) kept: Vec<Span>,
    /// Spans not kept (past [`MAX_SPANS`] and below the highest kept).
    pub(crate) dropped: u64,
    /// The raw split of the open span (pid, live bytes per origin slot),
    /// to tell whether the next tick extends it; None: no span open.
    open: Option<Vec<(u32, Vec<u64>)>>,
}

/// A process as the tick sees it.
pub(crate) struct Member<'a> {
    pub(crate) pid: u32,
    pub(crate) region: &'a Region,
    /// Its executable (names "the program").
    pub(crate) exe: Option<&'a str>,
}

/// The live bytes of each origin slot of `region` on device `d`.
fn raw_live(region: &Region, d: u32) -> Vec<u64> {
    let o = &region.layout().origins;
    let n = (o.count.load(Acquire) as usize).min(MAX_ORIGINS);
    o.slots[..n]
        .iter()
        .map(|s| s.live.get(d as usize).map_or(0, |l| l.load(Relaxed)))
        .collect()
}

impl Spans {
    /// One tick on device `d`: `interval_peak` is the tree's exact peak
    /// since the tick before. Extends the open span, opens a new one, or
    /// closes it when the tree is not seen whole at that peak.
    pub(crate) fn tick(
        &mut self,
        tree: &Region,
        d: u32,
        interval_peak: u64,
        members: &[Member<'_>],
        now_ns: u64,
    ) {
        let before = tree.current(Counter::Device(d));
        if before == 0 || before != interval_peak {
            self.open = None;
            return;
        }
        let raw: Vec<(u32, Vec<u64>)> = members
            .iter()
            .map(|m| (m.pid, raw_live(m.region, d)))
            .filter(|(_, v)| v.iter().any(|&b| b > 0))
            .collect();
        let sum: u64 = raw.iter().flat_map(|(_, v)| v.iter()).sum();
        let after = tree.current(Counter::Device(d));
        if after != before || sum != before {
            self.open = None;
            return;
        }
        if self.open.as_ref() == Some(&raw) {
            if let Some(s) = self.kept.last_mut() {
                s.last_ns = now_ns;
                return;
            }
        }
        self.open = Some(raw.clone());
        let by_origin = merge(
            members
                .iter()
                .filter_map(|m| {
                    let (_, v) = raw.iter().find(|(p, _)| *p == m.pid)?;
                    Some((m, v))
                })
                .flat_map(|(m, v)| {
                    let origins = m.region.origins();
                    let lines: Vec<OriginLine> = v
                        .iter()
                        .enumerate()
                        .filter(|(_, &b)| b > 0)
                        .filter_map(|(i, &b)| {
                            let o = origins.iter().find(|o| o.id == i)?.clone();
                            let p = PeakOrigins {
                                peak: b,
                                at_ns: 0,
                                by_origin: vec![memprobe_interpose_reader::origins::OriginBytes {
                                    origin: o,
                                    bytes: b,
                                }],
                            };
                            named(p, m.exe).by_origin.into_iter().next()
                        })
                        .collect();
                    lines
                })
                .collect(),
        );
        // A slot named after the load above (a race with a new origin) is
        // not in `origins`: the split is then not whole, and not kept.
        if by_origin.iter().map(|o| o.bytes).sum::<u64>() != before {
            self.open = None;
            return;
        }
        let span = Span {
            first_ns: now_ns,
            last_ns: now_ns,
            total: before,
            by_origin,
        };
        if self.kept.len() < MAX_SPANS || self.kept.iter().all(|s| s.total < before) {
            self.kept.push(span);
        } else {
            self.open = None;
            self.dropped += 1;
        }
    }

    /// Moves every span's times onto the run's timeline (ns since the
    /// spawn, whose `CLOCK_MONOTONIC` time is `t0_mono_ns`).
    pub(crate) fn place_in_run(&mut self, t0_mono_ns: u64) {
        for s in &mut self.kept {
            s.first_ns = s.first_ns.saturating_sub(t0_mono_ns);
            s.last_ns = s.last_ns.saturating_sub(t0_mono_ns);
        }
    }

    /// The span holding `total` bytes at a tick within `[start, end]`
    /// (timeline ns), the latest such tick in it.
    pub(crate) fn at(&self, total: u64, start: u64, end: u64) -> Option<(&Span, u64)> {
        self.kept
            .iter()
            .filter(|s| s.total == total && s.first_ns <= end && s.last_ns >= start)
            .map(|s| (s, s.last_ns.min(end)))
            .next_back()
    }
}

/// Origin lines of several processes merged by library and symbol, largest
/// first, at most [`MAX_LINES`] (the rest summed as "other origins").
pub(crate) fn merge(lines: Vec<OriginLine>) -> Vec<OriginLine> {
    let mut merged: Vec<OriginLine> = Vec::new();
    for l in lines {
        match merged
            .iter_mut()
            .find(|m| m.library == l.library && m.symbol == l.symbol && m.name == l.name)
        {
            Some(m) => m.bytes += l.bytes,
            None => merged.push(l),
        }
    }
    merged.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
    if merged.len() > MAX_LINES {
        let rest: u64 = merged[MAX_LINES - 1..].iter().map(|o| o.bytes).sum();
        merged.truncate(MAX_LINES - 1);
        merged.push(OriginLine {
            name: "other origins".into(),
            library: OVERFLOW_LIBRARY.into(),
            symbol: None,
            bytes: rest,
        });
    }
    merged
}

/// How a tree breakdown was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Found {
    /// One process held the whole peak: its own breakdown.
    OneProcess,
    /// Seen whole at a tick where the tree stood at that peak.
    AtTick,
}

/// The tree's bytes by origin at a peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TreeOrigins {
    #[serde(flatten)]
    pub(crate) origins: OriginsAtPeak,
    /// When the tree held it, seconds since the start (the allocation that
    /// raised the process's peak, or the tick).
    pub(crate) at_s: Option<f64>,
    pub(crate) found: Found,
    /// The process whose breakdown it is (`one_process`).
    pub(crate) pid: Option<u32>,
    /// The phase the command's trackers had open then (`epoch 3 / step
    /// 812`), when phases arrived over the run channel.
    pub(crate) phase: Option<String>,
}

/// Why a breakdown is missing.
pub(crate) const NOT_SEEN: &str =
    "several processes held memory at the peak and no tick saw the tree at it";

/// Why no process breakdown exists where one process held the peak.
pub(crate) const NOT_KEPT: &str =
    "the interposer kept no breakdown (origins off, MEMPROBE_GPU_ORIGINS=off)";

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_interpose_reader::Region;
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    /// A region in a directory of its own (a tree region is a plain
    /// region: the processes' are the same layout).
    fn region(tag: &str) -> (Arc<Region>, std::path::PathBuf) {
        let d = std::env::temp_dir().join(format!(
            "memprobe-tree-origins-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        (Region::create_tree(&d).unwrap(), d)
    }

    /// `bytes` more for `library` in `process`, and in the tree.
    fn alloc(tree: &Region, process: &Region, library: &str, bytes: u64) {
        let o = process
            .layout()
            .claim_origin(library.as_bytes(), b"", 0, 0, false);
        process.layout().add_from(o, 0, bytes);
        tree.layout().add(0, bytes);
    }

    #[test]
    fn a_tick_keeps_the_tree_only_when_it_is_seen_whole_at_its_peak() {
        let (tree, d0) = region("tree");
        let (a, d1) = region("a");
        let (b, d2) = region("b");
        let members = |both: bool| {
            let mut m = vec![Member {
                pid: 1,
                region: &a,
                exe: None,
            }];
            if both {
                m.push(Member {
                    pid: 2,
                    region: &b,
                    exe: None,
                });
            }
            m
        };
        alloc(&tree, &a, "/l/libnccl.so.2", 4 * MIB);
        alloc(&tree, &b, "/l/libc10_cuda.so", 6 * MIB);
        let mut s = Spans::default();
        // The tree stood at 10, its interval's peak: kept, named.
        s.tick(&tree, 0, 10 * MIB, &members(true), 100);
        assert_eq!(s.kept.len(), 1);
        let names: Vec<(&str, u64)> = s.kept[0]
            .by_origin
            .iter()
            .map(|o| (o.name.as_str(), o.bytes / MIB))
            .collect();
        assert_eq!(names, vec![("PyTorch caching allocator", 6), ("NCCL", 4)]);
        // The same split at the next tick extends the span.
        s.tick(&tree, 0, 10 * MIB, &members(true), 200);
        assert_eq!((s.kept.len(), s.kept[0].last_ns), (1, 200));
        // Above the tree's bytes now (a spike between ticks): nothing kept,
        // the span closed.
        s.tick(&tree, 0, 11 * MIB, &members(true), 300);
        assert_eq!(s.kept.len(), 1);
        // A process not read (its region not yet opened): the sum is short.
        s.tick(&tree, 0, 10 * MIB, &members(false), 400);
        assert_eq!(s.kept.len(), 1);
        // Seen whole again: a new span (the last one was closed).
        s.tick(&tree, 0, 10 * MIB, &members(true), 500);
        assert_eq!(s.kept.len(), 2);
        assert_eq!(s.at(10 * MIB, 150, 250).map(|(_, t)| t), Some(200));
        assert_eq!(s.at(10 * MIB, 450, 600).map(|(_, t)| t), Some(500));
        assert!(s.at(10 * MIB, 300, 400).is_none());
        assert!(s.at(11 * MIB, 0, 1000).is_none());
        for d in [d0, d1, d2] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn spans_are_bounded_and_the_highest_always_kept() {
        let (tree, d0) = region("bound");
        let (a, d1) = region("bound-a");
        let m = [Member {
            pid: 1,
            region: &a,
            exe: None,
        }];
        let mut s = Spans::default();
        for i in 0..MAX_SPANS as u64 + 10 {
            // Alternating splits: every tick a new span.
            let lib = if i % 2 == 0 {
                "/l/liba.so"
            } else {
                "/l/libb.so"
            };
            alloc(&tree, &a, lib, 1);
            let now = tree.current(Counter::Device(0));
            s.tick(&tree, 0, now, &m, i);
        }
        assert_eq!(s.kept.len(), MAX_SPANS + 10, "each new high is kept");
        // A lower split past the bound is counted, not kept.
        let o = a.layout().claim_origin(b"/l/liba.so", b"", 0, 0, false);
        a.layout().sub_from(o, 0, 5);
        tree.layout().sub(0, 5);
        let now = tree.current(Counter::Device(0));
        s.tick(&tree, 0, now, &m, 1 << 40);
        assert_eq!((s.kept.len(), s.dropped), (MAX_SPANS + 10, 1));
        for d in [d0, d1] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn lines_past_the_bound_fold_into_other_origins() {
        let lines: Vec<OriginLine> = (0..MAX_LINES as u64 + 5)
            .map(|i| OriginLine {
                name: format!("lib{i}.so"),
                library: format!("/l/lib{i}.so"),
                symbol: None,
                bytes: 1000 + i,
            })
            .collect();
        let total: u64 = lines.iter().map(|l| l.bytes).sum();
        let m = merge(lines);
        assert_eq!(m.len(), MAX_LINES);
        assert_eq!(m.last().unwrap().name, "other origins");
        assert_eq!(m.iter().map(|l| l.bytes).sum::<u64>(), total);
        assert_eq!(m[0].bytes, 1000 + MAX_LINES as u64 + 4);
    }

    /// What a tick costs (printed; run with --nocapture): 16 processes
    /// holding memory, the tree at its peak with the same split (the
    /// steady state of a training run), and not at its peak.
    #[test]
    fn a_ticks_cost() {
        let (tree, d0) = region("cost");
        let procs: Vec<_> = (0..16).map(|i| region(&format!("cost-{i}"))).collect();
        for (p, _) in &procs {
            for lib in [
                "/l/libc10_cuda.so",
                "/l/libnccl.so.2",
                "/l/libcublasLt.so.12",
            ] {
                alloc(&tree, p, lib, MIB);
            }
        }
        let m: Vec<Member<'_>> = procs
            .iter()
            .enumerate()
            .map(|(i, (r, _))| Member {
                pid: i as u32,
                region: r,
                exe: None,
            })
            .collect();
        let now = tree.current(Counter::Device(0));
        let mut s = Spans::default();
        let n = 2000u32;
        let t = std::time::Instant::now();
        for i in 0..n {
            s.tick(&tree, 0, now, &m, u64::from(i));
        }
        let steady = t.elapsed() / n;
        let t = std::time::Instant::now();
        for i in 0..n {
            s.tick(&tree, 0, now + 1, &m, u64::from(i));
        }
        let off_peak = t.elapsed() / n;
        assert_eq!(s.kept.len(), 1);
        println!(
            "tick, 16 processes at the tree's peak: {steady:?}; not at its peak: {off_peak:?}"
        );
        std::fs::remove_dir_all(d0).unwrap();
        for (_, d) in procs {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
