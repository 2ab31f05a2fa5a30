//! `memprobe run --pss`: the tree's PSS and USS beside its summed RSS.
//!
//! Summed RSS counts a page once in every process that maps it, so
//! DataLoader workers forked from a trainer (sharing its pages
//! copy-on-write) make the tree look several times its real size. With
//! `--pss` every tick also reads each live process's `smaps_rollup`
//! (memprobe-core's [`SmapsReader`], one read giving both figures) and sums
//! them: the PSS counts every page of the tree once, the USS only the pages
//! private to each process. The summary then shows what the other processes
//! really add: their USS, the pages they hold alone (ending them would free
//! these; the rest of their RSS is shared).
//!
//! The kernel walks every mapping of every process at each read
//! (milliseconds for a process of several GiB): the reads' mean and longest
//! time are reported, and a run whose ticks fall behind counts them in
//! `missed_ticks`. A reading during which processes kept ending (see
//! memprobe-core's `tree_smaps`) could count their shared pages twice: it is
//! left out of the timeline and the peaks, and counted.
//!
//! A reading is not one snapshot: the processes are read one after the
//! other. While workers fault in pages they share (a `MAP_SHARED` buffer,
//! pages inherited copy-on-write), a process read early counts a page in
//! full that the processes read after it count again in shares: summed, the
//! tree's PSS overshoots (268–362 MiB for 257 MiB held). So each reading is
//! two passes in opposite orders, and keeps each process's smaller figure:
//! a process's share of a page only falls as more processes map it, so the
//! later of its two reads counts such a page in its smaller share, and a
//! process read first in one pass is read last in the other. What a reading
//! guarantees: with sharing steady, the tree's PSS at that moment (both
//! passes agree); while sharing grows, no more than a few pages above the
//! tree's PSS at the reading's end (measured: the peak PSS equal to the
//! tree's steady PSS, 257 MiB, to the MiB in 6 runs of three workers
//! faulting in a 256 MiB `MAP_SHARED` buffer, where a single pass peaked at
//! 268–283 MiB); while a process grows, short by what
//! it allocated during the reading. `max_spread_bytes` is the largest
//! difference between a reading's two passes: how much the tree changed
//! while readings were taken.

use crate::units;
use memprobe_core::internal::smaps::{SmapsReader, TreeSmapsReading};
use serde::Serialize;

/// One tick's reading: the tree's PSS and USS, or `None` when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PssPoint {
    pub(crate) pss: Option<u64>,
    pub(crate) uss: Option<u64>,
}

/// What the sampling thread keeps of the tree's PSS and USS.
#[derive(Debug, Default)]
pub(crate) struct PssRecord {
    reader: SmapsReader,
    /// The largest tree PSS, when, and in that reading: the command's own
    /// PSS, the other processes' USS, and how many processes it summed.
    peak_pss: Option<PeakPss>,
    /// The largest tree USS, and when.
    peak_uss: Option<(u64, u64)>,
    reads: u64,
    errors: u64,
    /// Readings taken twice because a process ended during the first pass.
    retried: u64,
    /// Readings left out because processes ended during both passes.
    unsettled: u64,
    /// The largest difference between a kept reading's two passes.
    max_spread: u64,
    last_error: Option<String>,
    read_ns_total: u64,
    read_ns_max: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeakPss {
    bytes: u64,
    at_ns: u64,
    command: Option<u64>,
    others_uss: u64,
    processes: u32,
}

impl PssRecord {
    /// Reads the PSS and USS of `pids` (the tree's live processes at this
    /// tick; `command` is the direct child's pid) at `now`.
    pub(crate) fn tick(&mut self, pids: &[u32], command: u32, now: u64) -> PssPoint {
        let t0 = std::time::Instant::now();
        let read = self.settled_read(pids);
        let took = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.observe(read.map_err(|e| e.to_string()), command, now, took)
    }

    /// Two passes in opposite orders, each process's smaller figures kept
    /// (see the module's text).
    fn settled_read(&mut self, pids: &[u32]) -> memprobe_core::Result<TreeSmapsReading> {
        let forward = self.reader.read(pids.iter().copied())?;
        let reverse = self.reader.read(pids.iter().rev().copied())?;
        let (mut r, spread) = smaller(forward, reverse);
        // Every process gone by the time it was read (the tree ending): no
        // reading, not a tree of 0 bytes.
        if r.processes.is_empty() && !pids.is_empty() {
            r.settled = false;
        }
        self.max_spread = self.max_spread.max(spread);
        Ok(r)
    }

    /// Folds in one reading (or why it failed) taken at `now` in `took` ns.
    fn observe(
        &mut self,
        read: Result<TreeSmapsReading, String>,
        command: u32,
        now: u64,
        took: u64,
    ) -> PssPoint {
        self.reads += 1;
        self.read_ns_total = self.read_ns_total.saturating_add(took);
        self.read_ns_max = self.read_ns_max.max(took);
        let r = match read {
            Ok(r) => r,
            Err(e) => {
                self.errors += 1;
                self.last_error = Some(e);
                return PssPoint::default();
            }
        };
        if r.passes > 1 {
            self.retried += 1;
        }
        if !r.settled {
            // Shared pages of an ending process may be counted twice: no
            // figure rather than a wrong peak.
            self.unsettled += 1;
            return PssPoint::default();
        }
        if self.peak_pss.map_or(true, |p| r.pss > p.bytes) {
            self.peak_pss = Some(PeakPss {
                bytes: r.pss,
                at_ns: now,
                command: r
                    .processes
                    .iter()
                    .find(|p| p.pid == command)
                    .map(|p| p.rollup.pss),
                others_uss: r
                    .processes
                    .iter()
                    .filter(|p| p.pid != command)
                    .map(|p| p.rollup.uss)
                    .sum(),
                processes: u32::try_from(r.processes.len()).unwrap_or(u32::MAX),
            });
        }
        if self.peak_uss.map_or(true, |(v, _)| r.uss > v) {
            self.peak_uss = Some((r.uss, now));
        }
        PssPoint {
            pss: Some(r.pss),
            uss: Some(r.uss),
        }
    }

    /// The JSON object.
    pub(crate) fn report(&self) -> PssReport {
        let s = |ns: u64| ns as f64 / 1e9;
        PssReport {
            peak_pss_bytes: self.peak_pss.map(|p| p.bytes),
            peak_pss_at_s: self.peak_pss.map(|p| s(p.at_ns)),
            command_pss_at_peak_bytes: self.peak_pss.and_then(|p| p.command),
            others_uss_at_peak_bytes: self.peak_pss.map(|p| p.others_uss),
            processes_at_peak: self.peak_pss.map(|p| p.processes),
            peak_uss_bytes: self.peak_uss.map(|(v, _)| v),
            peak_uss_at_s: self.peak_uss.map(|(_, t)| s(t)),
            peak_fidelity: "sampled",
            reads: self.reads,
            read_errors: self.errors,
            retried_reads: self.retried,
            unsettled_reads: self.unsettled,
            max_spread_bytes: self.max_spread,
            last_error: self.last_error.clone(),
            mean_read_s: (self.reads > 0).then(|| s(self.read_ns_total) / self.reads as f64),
            max_read_s: (self.reads > 0).then(|| s(self.read_ns_max)),
        }
    }
}

/// Of a reading's two passes in opposite orders, each process's smaller
/// PSS (and its USS from the same pass), summed; and how far the two
/// passes' sums were apart. Unsettled if either pass was; read again
/// (`passes` 2) if either was. A process read in one pass only (it ended,
/// or the other pass found it gone) is left out: it was ending.
fn smaller(a: TreeSmapsReading, b: TreeSmapsReading) -> (TreeSmapsReading, u64) {
    let spread = a.pss.abs_diff(b.pss);
    let mut r = TreeSmapsReading {
        settled: a.settled && b.settled,
        passes: a.passes.max(b.passes),
        vanished: a.vanished.max(b.vanished),
        ..TreeSmapsReading::default()
    };
    for p in &a.processes {
        let Some(q) = b.processes.iter().find(|q| q.pid == p.pid) else {
            continue;
        };
        let keep = if q.rollup.pss < p.rollup.pss { q } else { p };
        r.pss += keep.rollup.pss;
        r.uss += keep.rollup.uss;
        r.processes.push(*keep);
    }
    (r, spread)
}

/// `pss` in the JSON document (only with `--pss`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PssReport {
    pub(crate) peak_pss_bytes: Option<u64>,
    pub(crate) peak_pss_at_s: Option<f64>,
    pub(crate) command_pss_at_peak_bytes: Option<u64>,
    pub(crate) others_uss_at_peak_bytes: Option<u64>,
    pub(crate) processes_at_peak: Option<u32>,
    pub(crate) peak_uss_bytes: Option<u64>,
    pub(crate) peak_uss_at_s: Option<f64>,
    pub(crate) peak_fidelity: &'static str,
    pub(crate) reads: u64,
    pub(crate) read_errors: u64,
    pub(crate) retried_reads: u64,
    pub(crate) unsettled_reads: u64,
    /// The largest difference between a reading's two passes: how short a
    /// reading may count while sharing changed under it.
    pub(crate) max_spread_bytes: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) mean_read_s: Option<f64>,
    pub(crate) max_read_s: Option<f64>,
}

/// The summary's rows, as (label, text): the tree's summed RSS peak beside
/// its PSS and USS peaks, then what the processes other than the command add
/// (their USS at the PSS peak: a worker's share of the command's pages is in
/// its PSS, but ending it would not free them).
pub(crate) fn summary_rows(r: &PssReport, tree_rss_peak: u64) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    let (Some(pss), Some(uss)) = (r.peak_pss_bytes, r.peak_uss_bytes) else {
        rows.push((
            "tree PSS / USS",
            format!(
                "unavailable: {}",
                r.last_error.as_deref().unwrap_or("no reading succeeded")
            ),
        ));
        return rows;
    };
    let cost = r
        .mean_read_s
        .map(|m| format!("; {} per read", ms(m)))
        .unwrap_or_default();
    rows.push((
        "tree PSS / USS",
        format!(
            "tree RSS {} (summed; shared pages counted once per process) · PSS {} · USS {}  (sampled peaks{cost})",
            units::bytes(tree_rss_peak),
            units::bytes(pss),
            units::bytes(uss),
        ),
    ));
    if let (Some(own), Some(others_uss), Some(n)) = (
        r.command_pss_at_peak_bytes,
        r.others_uss_at_peak_bytes,
        r.processes_at_peak,
    ) {
        let others = n.saturating_sub(1);
        if others > 0 {
            rows.push((
                "beyond the command",
                format!(
                    "{others} other process{} held {} of their own (USS) at the PSS peak; the rest of their RSS is shared (the command's PSS {})",
                    if others == 1 { "" } else { "es" },
                    units::bytes(others_uss),
                    units::bytes(own),
                ),
            ));
        }
    }
    if r.read_errors > 0 {
        rows.push((
            "tree PSS errors",
            format!(
                "{} of {} reads failed: {}",
                r.read_errors,
                r.reads,
                r.last_error.as_deref().unwrap_or("")
            ),
        ));
    }
    rows
}

/// Seconds as milliseconds for a read's cost: `0.41 ms`, `12.3 ms`.
fn ms(s: f64) -> String {
    let ms = s * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_core::internal::smaps::ProcessSmaps;
    use memprobe_core::internal::smaps::SmapsRollup;

    const MIB: u64 = 1 << 20;

    fn reading(parts: &[(u32, u64, u64)]) -> TreeSmapsReading {
        let processes: Vec<ProcessSmaps> = parts
            .iter()
            .map(|&(pid, pss, uss)| ProcessSmaps {
                pid,
                rollup: SmapsRollup { pss, uss },
            })
            .collect();
        TreeSmapsReading {
            pss: processes.iter().map(|p| p.rollup.pss).sum(),
            uss: processes.iter().map(|p| p.rollup.uss).sum(),
            processes,
            vanished: 0,
            settled: true,
            passes: 1,
        }
    }

    #[test]
    fn peaks_the_commands_share_errors_and_the_rows() {
        let mut r = PssRecord::default();
        let p = r.observe(Ok(reading(&[(10, 100 * MIB, 90 * MIB)])), 10, 0, 1_000);
        assert_eq!(p.pss, Some(100 * MIB));
        // Four workers sharing the parent's pages: each adds a little PSS.
        let workers = [
            (10, 820 * MIB, 700 * MIB),
            (11, 30 * MIB, 5 * MIB),
            (12, 30 * MIB, 5 * MIB),
            (13, 30 * MIB, 5 * MIB),
            (14, 30 * MIB, 5 * MIB),
        ];
        r.observe(Ok(reading(&workers)), 10, 1_000_000_000, 3_000);
        let failed = r.observe(Err("permission denied".into()), 10, 2_000_000_000, 2_000);
        assert_eq!(failed, PssPoint::default());
        // Workers ending during both passes: an overshoot, left out.
        let mut unsettled = reading(&[(10, 900 * MIB, 1), (11, 900 * MIB, 1)]);
        (unsettled.settled, unsettled.passes) = (false, 2);
        assert_eq!(r.observe(Ok(unsettled), 10, 3, 1), PssPoint::default());
        let mut retried = reading(&[(10, 5 * MIB, 1)]);
        retried.passes = 2;
        assert_eq!(r.observe(Ok(retried), 10, 4, 1).pss, Some(5 * MIB));
        let rep = r.report();
        assert_eq!(rep.peak_pss_bytes, Some(940 * MIB));
        assert_eq!(rep.peak_pss_at_s, Some(1.0));
        assert_eq!(rep.command_pss_at_peak_bytes, Some(820 * MIB));
        assert_eq!(rep.others_uss_at_peak_bytes, Some(20 * MIB));
        assert_eq!(rep.processes_at_peak, Some(5));
        assert_eq!(rep.peak_uss_bytes, Some(720 * MIB));
        assert_eq!((rep.reads, rep.read_errors), (5, 1));
        assert_eq!((rep.retried_reads, rep.unsettled_reads), (2, 1));
        assert_eq!(rep.max_read_s, Some(3e-6));
        let rows = summary_rows(&rep, 2816 * MIB);
        assert_eq!(rows[0].0, "tree PSS / USS");
        assert_eq!(
            rows[0].1,
            "tree RSS 2.75 GiB (summed; shared pages counted once per process) · PSS 940 MiB · \
             USS 720 MiB  (sampled peaks; 0.00 ms per read)"
        );
        assert_eq!(rows[1].0, "beyond the command");
        assert_eq!(
            rows[1].1,
            "4 other processes held 20.0 MiB of their own (USS) at the PSS peak; the rest of \
             their RSS is shared (the command's PSS 820 MiB)"
        );
        assert!(rows[2].1.contains("1 of 5 reads failed: permission denied"));
    }

    #[test]
    fn no_reading_at_all_says_why() {
        let mut r = PssRecord::default();
        r.observe(Err("cannot read".into()), 1, 0, 1);
        let rows = summary_rows(&r.report(), 5);
        assert_eq!(
            rows,
            vec![("tree PSS / USS", "unavailable: cannot read".into())]
        );
    }
}
