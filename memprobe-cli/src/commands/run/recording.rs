//! What `memprobe run` records: the [`Timeline`] of the tree, the container
//! and each GPU, every process's exact peak, the container's and the GPUs'
//! peaks.

use super::exit_stats::ExitHwmReport;
use super::host_kinds::{Detail, KindsAtPeak, KindsCost, RssKinds};
use super::pid_map::PidMap;
use super::timeline::{Point, Timeline};
use crate::gpu_readings::GpuReading;
use memprobe_core::internal::process::ProcessStatus;
use memprobe_core::Sample;
use memprobe_core::{CgroupLocation, CgroupVersion};
use std::collections::BTreeMap;

/// Where a process's peak figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeakSource {
    /// `VmHWM` from `/proc/<pid>/status`, last read while the process lived.
    VmHwm,
    /// `ru_maxrss` from `wait4` on the direct child: exact to its exit.
    Rusage,
    /// The kernel's high-water mark at the process's exit (taskstats, see
    /// [`crate::commands::run::exit_stats`]): above every `VmHWM` read
    /// while it lived.
    ExitHwm,
}

impl PeakSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PeakSource::VmHwm => "vmhwm",
            PeakSource::Rusage => "rusage",
            PeakSource::ExitHwm => "exit_hwm",
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
    /// Whether that `ru_maxrss` may be a child's: the kernel folds in the
    /// peak of every child the process waited for (and theirs). `Some(true)`:
    /// it had children; `Some(false)`: it had none (every birth seen);
    /// `None`: unknown (no process events, and no sample saw a child).
    pub(crate) rusage_children: Option<bool>,
    /// The last `VmRSS` sampled, bytes.
    pub(crate) last_rss: u64,
    /// The sample that first saw it ended, ns.
    pub(crate) ended_ns: Option<u64>,
    /// Its wait status, when a sample caught it as a zombie (before its
    /// parent reaped it): how a process that is not memprobe's child died.
    pub(crate) wait_status: Option<i32>,
    /// Its high-water mark at exit, from the kernel's exit record, bytes.
    pub(crate) exit_hwm: Option<u64>,
    /// Its memory by kind at its largest sample.
    pub(crate) kinds_at_peak: Option<Box<KindsAtPeak>>,
}

impl ProcessRecord {
    /// A process first seen at `now`.
    fn first_seen(pid: u32, now: u64) -> ProcessRecord {
        ProcessRecord {
            pid,
            ppid: None,
            name: String::new(),
            first_seen_ns: now,
            last_seen_ns: now,
            exited: false,
            vmhwm: None,
            max_sampled_rss: 0,
            rusage_maxrss: None,
            rusage_children: None,
            last_rss: 0,
            ended_ns: None,
            wait_status: None,
            exit_hwm: None,
            kinds_at_peak: None,
        }
    }

    /// Folds in one sample at `now`: its resident set, and its status when
    /// it was read at this sample; whether the sample is its largest yet.
    fn observe(&mut self, rss: u64, status: Option<&ProcessStatus>, now: u64) -> bool {
        if let Some(s) = status {
            if self.name != s.name {
                self.name.clone_from(&s.name);
            }
            if s.ppid.is_some() {
                self.ppid = s.ppid;
            }
            self.vmhwm = Some(self.vmhwm.unwrap_or(0).max(s.hwm));
        }
        let new_peak = rss > self.max_sampled_rss;
        self.max_sampled_rss = self.max_sampled_rss.max(rss);
        self.last_rss = rss;
        self.last_seen_ns = now;
        new_peak
    }

    /// The exact peak and where it comes from. `ru_maxrss` is the
    /// process's own only where it had no children: a worker's 255 MiB,
    /// reaped by the command, would otherwise be credited to the command.
    pub(crate) fn peak(&self) -> (u64, PeakSource) {
        // Both exit figures are exact to the exit; rusage, where it is the
        // process's own, is named first.
        let lived = self.vmhwm.unwrap_or(0).max(self.max_sampled_rss);
        let rusage = self
            .rusage_maxrss
            .filter(|_| self.rusage_children != Some(true))
            .unwrap_or(0);
        let exit = self.exit_hwm.unwrap_or(0);
        if rusage > lived && rusage >= exit {
            (rusage, PeakSource::Rusage)
        } else if exit > lived {
            (exit, PeakSource::ExitHwm)
        } else {
            (lived, PeakSource::VmHwm)
        }
    }
}

/// An orphan of the tree memprobe reaped (see [`crate::commands::run::orphans`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OrphanEnd {
    pub(crate) pid: u32,
    pub(crate) name: String,
    /// When it was reaped, ns since the start.
    pub(crate) ended_ns: u64,
    pub(crate) wait_status: i32,
}

/// At most this many orphans are kept.
pub(crate) const MAX_ORPHANS: usize = 4096;

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

impl CgroupRecord {
    /// The cgroup at `loc`, nothing read yet.
    pub(crate) fn new(loc: &CgroupLocation) -> CgroupRecord {
        CgroupRecord {
            version: loc.version,
            path: loc.dir.display().to_string(),
            limit: None,
            start: None,
            end: None,
            sampled_peak: None,
            exact_peak: None,
            errors: 0,
        }
    }

    /// Folds in one reading taken at `now` (`None`: the read failed) and
    /// returns the usage for the timeline.
    pub(crate) fn observe(&mut self, s: Option<Sample>, now: u64) -> Option<u64> {
        let Some(s) = s else {
            self.errors += 1;
            return None;
        };
        self.limit = s.limit;
        self.start.get_or_insert(s.used);
        self.end = Some(s.used);
        if self.sampled_peak.map_or(true, |(v, _)| s.used > v) {
            self.sampled_peak = Some((s.used, now));
        }
        Some(s.used)
    }
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

impl GpuSeries {
    /// The device as read at start.
    pub(crate) fn new(g: GpuReading) -> GpuSeries {
        GpuSeries {
            index: g.index,
            name: g.name,
            uuid: g.uuid,
            total: g.total_bytes,
            peak: None,
            tree_peak: None,
        }
    }

    /// Folds in this device's reading among `readings` (`None`: the read
    /// failed), counting the memory of the processes in `tree`; returns the
    /// device's used memory for the timeline.
    pub(crate) fn observe(
        &mut self,
        readings: Option<&[GpuReading]>,
        tree: &dyn Fn(u32) -> bool,
        now: u64,
    ) -> Option<u64> {
        let r = readings?.iter().find(|r| r.uuid == self.uuid)?;
        if self.peak.map_or(true, |(v, _)| r.used_bytes > v) {
            self.peak = Some((r.used_bytes, now));
        }
        let tree_used: u64 = r
            .processes
            .iter()
            .filter(|p| tree(p.pid))
            .filter_map(|p| p.used_bytes)
            .sum();
        self.tree_peak = Some(self.tree_peak.unwrap_or(0).max(tree_used));
        Some(r.used_bytes)
    }
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
    /// [`MAX_PROCESS_RECORDS`]); filled by [`finish`](Recording::finish).
    pub(crate) processes: Vec<ProcessRecord>,
    /// While recording: the processes alive at the last sample.
    live: PidMap<ProcessRecord>,
    /// Processes seen in all, including records dropped to stay bounded.
    pub(crate) processes_seen: u64,
    pub(crate) cgroup: Option<CgroupRecord>,
    pub(crate) gpus: Vec<GpuSeries>,
    /// With `--gpu-exact`: every process's and the tree's exact GPU figures.
    pub(crate) gpu_exact: Option<crate::commands::run::gpu_exact::ExactRecord>,
    /// With `--pss`: the tree's PSS and USS peaks and the reads' cost.
    pub(crate) pss: Option<crate::commands::run::tree_pss::PssReport>,
    /// Orphans of the tree memprobe reaped as their subreaper.
    pub(crate) orphans: Vec<OrphanEnd>,
    /// The container's OOM event counters over the run.
    pub(crate) oom_counters: crate::commands::run::oom_kill::CounterLog,
    /// Whether the kernel's OOM killer ended a process of the run (set
    /// after the child is reaped).
    pub(crate) oom_kill: Option<crate::commands::run::oom_kill::OomKillReport>,
    /// Source name -> why it was not measured.
    pub(crate) unavailable: BTreeMap<String, String>,
    /// Ticks skipped because the sampler fell behind its deadlines.
    pub(crate) missed_ticks: u64,
    /// With `--max-cpu`: how the interval was widened to stay under it.
    pub(crate) cpu_cap: Option<crate::commands::run::cpu_cap::CpuCapReport>,
    /// The phases the command's trackers sent (None: no channel).
    pub(crate) phases: Option<crate::commands::run::phase_log::PhaseLog>,
    /// Each process's resident set over time, for the chart.
    pub(crate) lines: crate::commands::run::process_lines::ProcessLines,
    /// The tree's memory by kind at its largest sample.
    pub(crate) tree_kinds: Option<KindsAtPeak>,
    /// What the detail reads of the kinds cost (None: not taken).
    pub(crate) kinds_cost: Option<KindsCost>,
    /// Whether exit records were had, and what they did.
    pub(crate) exit_hwm: ExitHwmReport,
    /// Processes that ended at the last few ticks: pid -> when seen gone,
    /// for an exit record that arrives after the tick that saw the end.
    recently_ended: PidMap<u64>,
    /// The time of the last point added: the tick before the one being
    /// folded in.
    last_tick_ns: u64,
}

/// At most this many process records are kept; beyond, the record with the
/// smallest peak among those that exited is dropped.
pub(crate) const MAX_PROCESS_RECORDS: usize = 4096;

impl Recording {
    /// Folds in one sample of `pid` at `now`: its resident set, and its
    /// status when it was read at this sample (always at its first).
    /// Only samples where something moved need folding in: a process whose
    /// `statm` reads as at the tick before has the same resident set, so
    /// its record's figures stand; when it was last seen is settled when it
    /// ends (the tick before the one that saw it gone) or at
    /// [`finish`](Recording::finish), and its line gets the point before a
    /// change (see [`ProcessLines::observe`]).
    /// Returns whether the sample is the process's largest yet (its kinds
    /// `kinds` then kept as at its peak).
    pub(crate) fn observe(
        &mut self,
        pid: u32,
        rss: u64,
        status: Option<&ProcessStatus>,
        kinds: Option<RssKinds>,
        now: u64,
    ) -> bool {
        let seen = &mut self.processes_seen;
        let r = self.live.entry(pid).or_insert_with(|| {
            *seen += 1;
            ProcessRecord::first_seen(pid, now)
        });
        let new_peak = r.observe(rss, status, now);
        if new_peak {
            // Updated in place (a growing process sets a peak at most
            // ticks); the detail read at an earlier peak stays until a new
            // one is.
            match r.kinds_at_peak.as_deref_mut() {
                Some(k) => {
                    k.rss = rss;
                    k.at_ns = now;
                    k.kinds = kinds;
                    k.processes = None;
                }
                None => {
                    r.kinds_at_peak = Some(Box::new(KindsAtPeak {
                        rss,
                        at_ns: now,
                        kinds,
                        detail: None,
                        processes: None,
                    }))
                }
            }
        }
        self.lines.observe(pid, rss, now, self.last_tick_ns);
        new_peak
    }

    /// The resident set of live `pid` at its last sample (0: not live).
    pub(crate) fn last_rss(&self, pid: u32) -> u64 {
        self.live.get(&pid).map_or(0, |r| r.last_rss)
    }

    /// A live process's latest detail reading of its kinds.
    pub(crate) fn put_detail(&mut self, pid: u32, d: Detail) {
        if let Some(k) = self
            .live
            .get_mut(&pid)
            .and_then(|r| r.kinds_at_peak.as_mut())
        {
            k.detail = Some(d);
        }
    }

    /// The live processes' latest detail readings (None: none yet), each
    /// with the process's resident set now.
    pub(crate) fn live_details(&self) -> impl Iterator<Item = (Option<&Detail>, u64)> {
        self.live.values().map(|r| {
            let d = r.kinds_at_peak.as_ref().and_then(|k| k.detail.as_ref());
            (d, r.last_rss)
        })
    }

    /// The exit record of `pid` (its high-water mark `hwm` at exit)
    /// arrived at `now`: folded into the record of the process that ended
    /// with that pid, live or seen gone at the last few ticks; a pid the
    /// tree does not know (any other process of the machine) is ignored.
    /// `name`: the process's name when it ended, where the record gives it
    /// (a process that exec'd just before it ended may not have been read
    /// under its new name).
    pub(crate) fn exit_hwm(&mut self, pid: u32, hwm: u64, name: Option<&str>, now: u64) {
        let fold = |r: &mut ProcessRecord| {
            r.exit_hwm = Some(r.exit_hwm.unwrap_or(0).max(hwm));
            if let Some(n) = name.filter(|n| *n != r.name) {
                r.name = n.to_string();
            }
        };
        // A live record that started after this arrived is a new process
        // with a reused pid: not the one that exited.
        if let Some(r) = self.live.get_mut(&pid).filter(|r| r.first_seen_ns <= now) {
            fold(r);
            return;
        }
        if self.recently_ended.contains_key(&pid) {
            if let Some(r) = self.processes.iter_mut().rev().find(|r| r.pid == pid) {
                fold(r);
            }
        }
    }

    /// Forgets the processes that ended before `before` (their exit
    /// records have arrived by then).
    pub(crate) fn forget_ended_before(&mut self, before: u64) {
        if !self.recently_ended.is_empty() {
            self.recently_ended.retain(|_, &mut t| t >= before);
        }
    }

    /// Marks `pid` as exited, seen at `now` with `wait_status` if it was
    /// caught as a zombie, and keeps its record, dropping the smallest
    /// exited one when too many are kept.
    pub(crate) fn exited(&mut self, pid: u32, now: u64, wait_status: Option<i32>) {
        // Alive at the tick before (a member read then), gone at this one.
        self.lines.exited(pid, self.last_tick_ns);
        let Some(mut record) = self.live.remove(&pid) else {
            return;
        };
        record.last_seen_ns = record.last_seen_ns.max(self.last_tick_ns);
        record.exited = true;
        record.ended_ns = Some(now);
        record.wait_status = wait_status;
        self.recently_ended.insert(pid, now);
        if self.processes.len() + self.live.len() >= MAX_PROCESS_RECORDS {
            if let Some((i, smallest)) = self
                .processes
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| r.peak().0)
            {
                if smallest.peak().0 >= record.peak().0 {
                    return;
                }
                self.processes.swap_remove(i);
            }
        }
        self.processes.push(record);
    }

    /// Sets the wait status of an exited process caught as a zombie later.
    pub(crate) fn ended_with(&mut self, pid: u32, wait_status: i32) {
        if let Some(r) = self.processes.iter_mut().rev().find(|r| r.pid == pid) {
            r.wait_status = Some(wait_status);
        }
    }

    /// Appends one sample's point.
    pub(crate) fn add_point(&mut self, p: Point) {
        self.samples += 1;
        self.last_tick_ns = p.t_ns;
        self.max_processes = self.max_processes.max(p.processes);
        if self.tree_peak.map_or(true, |(v, _)| p.tree_rss > v) {
            self.tree_peak = Some((p.tree_rss, p.t_ns));
        }
        self.timeline.push(p);
    }

    /// Ends recording: every process record, in order of discovery.
    pub(crate) fn finish(&mut self) {
        let last = self.last_tick_ns;
        self.lines.close(last);
        self.processes.extend(self.live.drain().map(|(_, mut r)| {
            r.last_seen_ns = r.last_seen_ns.max(last);
            r
        }));
        self.processes.sort_by_key(|r| (r.first_seen_ns, r.pid));
    }

    /// The process with the largest exact peak.
    pub(crate) fn peak_process(&self) -> Option<&ProcessRecord> {
        self.processes.iter().max_by_key(|p| p.peak().0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            rusage_children: None,
            last_rss: 80,
            ended_ns: None,
            wait_status: None,
            exit_hwm: None,
            kinds_at_peak: None,
        };
        assert_eq!(p.peak(), (100, PeakSource::VmHwm));
        // The exit record's high-water mark, when above what was read.
        p.exit_hwm = Some(100);
        assert_eq!(p.peak(), (100, PeakSource::VmHwm));
        p.exit_hwm = Some(120);
        assert_eq!(p.peak(), (120, PeakSource::ExitHwm));
        p.rusage_maxrss = Some(300);
        assert_eq!(p.peak(), (300, PeakSource::Rusage));
        p.rusage_children = Some(false);
        assert_eq!(p.peak(), (300, PeakSource::Rusage));
        // With children, ru_maxrss may be one of theirs: not its own.
        p.rusage_children = Some(true);
        assert_eq!(p.peak(), (120, PeakSource::ExitHwm));
    }
}
