//! The sampling thread of `run`: at every tick (absolute deadlines, no drift)
//! it reads the child's process tree ([`TreeSampler`]: each process's
//! `statm` in one `pread`, its status only when a figure asks for it), the
//! container ([`CgroupSampler`]) and the GPUs, and appends a point to the
//! [`Recording`].
//!
//! Why a loop of its own rather than the core's monitor: the monitor polls
//! only *sampled* sources with a window open and fans each reading into
//! windows, one source at a time. A run needs every series at every tick,
//! exact ones included (the container's usage on cgroup v2), as one timeline
//! point; a per-process record for a set of processes that changes from tick
//! to tick; the ticks it missed; and one last sample after the command ends.
//! So the loop below only schedules ticks; every reading comes from a core
//! sampler (or the GPU crate), and the bookkeeping is the [`Recording`]'s.
//!
//! A process's exact peak is the last `VmHWM` read while it lived (read at
//! every sample that is its largest yet, every
//! [`super::tree_sampler::STATUS_REFRESH_MOVING`] while its `statm` moves
//! and every [`super::tree_sampler::STATUS_REFRESH_IDLE`] while it is
//! idle); what this can miss is a spike that rose and fell between two
//! reads of it in its last moments before it exits: the last 100 ms of a
//! busy process, the last second of one whose `statm` read the same
//! throughout (the direct child is covered by `wait4`'s `ru_maxrss`, see
//! [`crate::commands::run::child::reap`]).
//! Where the kernel's exit records can be had ([`ExitStats`]), each
//! process's high-water mark at its exit closes that gap for every process.
//!
//! At each process's and the tree's largest sample, their memory by kind is
//! kept ([`super::host_kinds`]).

use super::cpu_cap::CpuCap;
use super::exit_stats::{ExitHwmReport, ExitStats};
use super::gpu_exact::Watcher;
use super::host_kinds::{self, KindsAtPeak, KindsReader};
use super::kernel_log::KernelLog;
use super::live::LiveState;
use super::oom_kill::ZombieWatch;
use super::recording::{CgroupRecord, GpuSeries, Recording};
use super::timeline::Point;
use super::tree_pss::{PssPoint, PssRecord};
use super::tree_sampler::{ticks, Feed, TreeSampler};
use crate::gpu_readings::{self, GpuReading};
use memprobe_core::CgroupSampler;
use memprobe_core::Sampler;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long after a process is seen gone its exit record may still arrive.
const EXIT_RECORD_GRACE_NS: u64 = 2_000_000_000;

/// What the sampling thread starts from.
pub(crate) struct Setup {
    /// The child's pid: the root of the tree.
    pub(crate) root: u32,
    pub(crate) interval: Duration,
    /// `--max-cpu`: memprobe's CPU cap, percent of one core.
    pub(crate) max_cpu: Option<f64>,
    /// When the child was spawned: time zero of the timeline.
    pub(crate) t0: Instant,
    /// The container's cgroup, or why there is none.
    pub(crate) cgroup: Result<CgroupSampler, String>,
    /// The GPUs at start, or why there are none.
    pub(crate) gpus: Result<Vec<GpuReading>, String>,
    /// Where the live status line reads from, if there is one.
    pub(crate) live: Option<Arc<LiveState>>,
    /// With `--gpu-exact`: the reader of the interposer's counters.
    pub(crate) exact: Option<Watcher>,
    /// With `--pss`: read the tree's PSS and USS at every tick.
    pub(crate) pss: bool,
    /// The kernel's log, read at every tick for its OOM-kill records.
    pub(crate) kernel_log: Option<Arc<Mutex<KernelLog>>>,
    /// memprobe's children from before the spawn (no orphans of the tree).
    pub(crate) inherited: Vec<u32>,
    /// The process events' births, where they can be had.
    pub(crate) feed: Option<Feed>,
    /// The kernel's exit records, or why there are none.
    pub(crate) exits: Result<ExitStats, String>,
    /// Keep each peak's memory by kind (`--no-host-kinds` turns it off).
    pub(crate) host_kinds: bool,
}

/// The running sampling thread.
pub(crate) struct SamplingThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Recording>,
}

impl SamplingThread {
    /// Starts sampling; the first sample is taken at once.
    pub(crate) fn start(setup: Setup) -> io::Result<SamplingThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("memprobe-sampler".into())
            .spawn(move || {
                let state = State::new(setup);
                // After State::new: the threads it starts keep the shared
                // table.
                super::own_files::own_file_table();
                state.run(&s)
            })?;
        Ok(SamplingThread { stop, handle })
    }

    /// Takes one last sample, stops and returns the recording.
    pub(crate) fn finish(self) -> Recording {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.thread().unpark();
        self.handle.join().unwrap_or_else(|_| {
            let mut r = Recording::default();
            r.unavailable
                .insert("tree".into(), "the sampling thread panicked".into());
            r
        })
    }
}

/// What [`State::ready`] found.
struct Ready {
    kernel_log: bool,
    exits: bool,
}

/// How often the things that rarely change are read: the cgroup's limit,
/// and the sweep for orphans no tick saw end.
const SLOW_SWEEP: Duration = Duration::from_secs(1);

struct State {
    tree: TreeSampler,
    /// Ticks taken, and every how many the slow sweep comes.
    ticks: u64,
    slow_every: u64,
    /// The cgroup's limit at the last slow sweep.
    cgroup_limit: Option<u64>,
    /// The kernel log's descriptor, duplicated: polled for records.
    kmsg_watch: Option<std::fs::File>,
    interval: Duration,
    cap: Option<CpuCap>,
    t0: Instant,
    cgroup: Option<CgroupSampler>,
    live: Option<Arc<LiveState>>,
    exact: Option<Watcher>,
    pss: Option<PssRecord>,
    zombies: ZombieWatch,
    kernel_log: Option<Arc<Mutex<KernelLog>>>,
    inherited: Vec<u32>,
    exits: Result<ExitStats, String>,
    kinds: Option<KindsReader>,
    /// The tree set a peak whose detail is not composed yet.
    tree_kinds_due: bool,
    tree_composed_ns: Option<u64>,
    rec: Recording,
}

impl State {
    fn new(setup: Setup) -> State {
        let mut rec = Recording::default();
        let cgroup = match setup.cgroup {
            Ok(c) => {
                rec.cgroup = Some(CgroupRecord::new(c.location()));
                rec.oom_counters =
                    crate::commands::run::oom_kill::CounterLog::new(c.location().version);
                Some(c)
            }
            Err(why) => {
                rec.unavailable.insert("cgroup".into(), why);
                None
            }
        };
        match setup.gpus {
            Ok(list) => rec.gpus = list.into_iter().map(GpuSeries::new).collect(),
            Err(why) => {
                rec.unavailable.insert("gpus".into(), why);
            }
        }
        let kmsg_watch = setup
            .kernel_log
            .as_ref()
            .and_then(|l| l.lock().ok()?.watch());
        State {
            tree: TreeSampler::new(setup.root, setup.interval, setup.feed),
            ticks: 0,
            slow_every: ticks(SLOW_SWEEP, setup.interval),
            cgroup_limit: None,
            kmsg_watch,
            interval: setup.interval,
            cap: setup.max_cpu.map(|m| CpuCap::new(m, setup.interval)),
            t0: setup.t0,
            cgroup,
            live: setup.live,
            exact: setup.exact,
            pss: setup.pss.then(PssRecord::default),
            zombies: ZombieWatch::default(),
            kernel_log: setup.kernel_log,
            inherited: setup.inherited,
            exits: setup.exits,
            kinds: setup.host_kinds.then(KindsReader::started),
            tree_kinds_due: false,
            tree_composed_ns: None,
            rec,
        }
    }

    fn run(mut self, stop: &AtomicBool) -> Recording {
        let mut deadline = Instant::now();
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            self.tick();
            if stopping {
                break;
            }
            if let Some(cap) = self.cap.as_mut() {
                let wider = cap.after_tick(Instant::now());
                if wider != self.interval {
                    self.interval = wider;
                    self.slow_every = ticks(SLOW_SWEEP, wider);
                    self.tree.set_interval(wider);
                }
            }
            deadline += self.interval;
            let now = Instant::now();
            if deadline <= now {
                // Fell behind (descheduled, slow reads): skip the missed
                // ticks instead of bursting, and stay on the original grid.
                let behind = now.duration_since(deadline).as_nanos();
                let skip = behind / self.interval.as_nanos() + 1;
                self.rec.missed_ticks += u64::try_from(skip).unwrap_or(u64::MAX);
                deadline += self.interval * u32::try_from(skip).unwrap_or(u32::MAX);
            }
            while !stop.load(Ordering::SeqCst) {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                thread::park_timeout(deadline - now);
            }
        }
        if let (Some(s), Some(rec)) = (self.cgroup.as_mut(), self.rec.cgroup.as_mut()) {
            rec.exact_peak = s.read_peak().ok().flatten();
        }
        if self.tree.by_path > 0 {
            self.rec.unavailable.insert(
                "tree_descriptors".into(),
                format!(
                    "{} processes' statm could not be kept open (no descriptor left under RLIMIT_NOFILE) and was read by path at each tick: a pid reused between two ticks would be misread",
                    self.tree.by_path
                ),
            );
        }
        // The timeline's zero on CLOCK_MONOTONIC (Instant's clock), for the
        // interposer's times.
        let t0_mono_ns = memprobe_core::monotonic_ns()
            .saturating_sub(u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        self.rec.gpu_exact = self.exact.take().map(|w| {
            let mut r = w.finish();
            r.place_in_run(t0_mono_ns);
            r
        });
        self.rec.pss = self.pss.as_ref().map(PssRecord::report);
        self.rec.cpu_cap = self.cap.as_ref().map(CpuCap::report);
        if let Some(k) = self.kinds.as_mut() {
            // A detail asked for at the last ticks is worth the short wait.
            for (pid, d) in k.settle(Duration::from_millis(200)) {
                self.rec.put_detail(pid, d);
            }
            self.rec.kinds_cost = Some(k.cost());
        }
        self.rec.finish();
        self.rec.exit_hwm = match &self.exits {
            Ok(x) => ExitHwmReport {
                source: "taskstats",
                available: true,
                reason: None,
                processes: self
                    .rec
                    .processes
                    .iter()
                    .filter(|p| p.exit_hwm.is_some())
                    .count() as u64,
                raised: self
                    .rec
                    .processes
                    .iter()
                    .filter(|p| p.peak().1 == super::recording::PeakSource::ExitHwm)
                    .count() as u64,
                overflows: x.overflows,
            },
            Err(why) => ExitHwmReport {
                source: "taskstats",
                available: false,
                reason: Some(why.clone()),
                ..ExitHwmReport::default()
            },
        };
        self.rec
    }

    /// Reaps the tree's orphans that ended (memprobe is their subreaper)
    /// and keeps how each ended.
    fn reap_orphans(&mut self, now: u64, only: Option<&[u32]>) {
        use crate::commands::run::orphans;
        let (root, inherited) = (self.tree.root(), &self.inherited);
        let reaped = match only {
            Some(pids) => orphans::reap_pids(pids, root, inherited),
            None => orphans::reap(root, inherited),
        };
        for o in reaped {
            self.rec.ended_with(o.pid, o.wait_status);
            if self.rec.orphans.len() < crate::commands::run::recording::MAX_ORPHANS {
                self.rec
                    .orphans
                    .push(crate::commands::run::recording::OrphanEnd {
                        pid: o.pid,
                        name: o.name,
                        ended_ns: now,
                        wait_status: o.wait_status,
                    });
            }
        }
    }

    /// Which of the event sources have something to read: one `poll` for
    /// both, instead of a read of each that finds nothing at most ticks.
    fn ready(&self) -> Ready {
        use std::os::fd::AsRawFd;
        let mut fds = [libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        }; 2];
        if let Some(f) = &self.kmsg_watch {
            fds[0].fd = f.as_raw_fd();
        }
        if let Ok(x) = &self.exits {
            fds[1].fd = x.raw_fd();
        }
        // SAFETY: two valid pollfd entries (a negative fd is skipped).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
        if n < 0 {
            // Cannot tell: read both, as if both were ready.
            return Ready {
                kernel_log: true,
                exits: true,
            };
        }
        Ready {
            kernel_log: fds[0].revents != 0,
            exits: fds[1].revents != 0,
        }
    }

    /// The kinds at a new tree peak, and the detail reads due.
    fn kinds_tick(&mut self, tree_rss: u64, now: u64) {
        let rec = &mut self.rec;
        if rec.tree_peak.map_or(true, |(v, _)| tree_rss > v) {
            let kinds = self.tree.kinds();
            let before = rec.tree_kinds.take();
            rec.tree_kinds = Some(KindsAtPeak {
                rss: tree_rss,
                at_ns: now,
                kinds,
                processes: before.as_ref().and_then(|k| k.processes),
                detail: before.and_then(|k| k.detail),
            });
            self.tree_kinds_due = true;
        }
        let Some(reader) = self.kinds.as_mut() else {
            return;
        };
        for (pid, d) in reader.tick(now, |pid| rec.last_rss(pid)) {
            rec.put_detail(pid, d);
            // A reading asked for at the tree's peak arrives after the
            // composition at that tick: compose again with it.
            self.tree_kinds_due |= rec.tree_kinds.is_some();
        }
        let gap = u64::try_from(host_kinds::MIN_GAP.as_nanos()).unwrap_or(u64::MAX);
        if self.tree_kinds_due && self.tree_composed_ns.map_or(true, |t| now >= t + gap) {
            let peak = rec.tree_kinds.as_ref().map_or(now, |t| t.at_ns);
            let (d, n) = host_kinds::compose(rec.live_details(), peak);
            // Kept only when nearer the peak than the one it would replace
            // (a process's reading at a later peak of its own is not).
            let far =
                |d: &host_kinds::Detail| peak.abs_diff(d.taken_ns).max(peak.abs_diff(d.newest_ns));
            if let Some(t) = rec.tree_kinds.as_mut() {
                if t.detail.as_ref().map_or(true, |old| far(&d) <= far(old)) {
                    t.detail = Some(d);
                    t.processes = Some(n);
                }
            }
            self.tree_kinds_due = false;
            self.tree_composed_ns = Some(now);
        }
    }

    fn tick(&mut self) {
        let now = u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // At once: the exact peaks belong to this instant (see take_peaks).
        let exact_peaks = self.exact.as_mut().map(Watcher::take_peaks);
        let tree = self.tree.read();
        let slow = self.ticks % self.slow_every == 0;
        self.ticks += 1;
        for (pid, status) in self.zombies.tick(now) {
            self.rec.ended_with(pid, status);
        }
        // An orphan that ended is seen gone by the tree's reading at the
        // same tick; the slow sweep reaps those never seen (memprobe's
        // other children, a process born and gone between two ticks).
        if slow {
            self.reap_orphans(now, None);
        } else if !tree.exited.is_empty() {
            self.reap_orphans(now, Some(&tree.exited));
        }
        let ready = self.ready();
        if let (Some(log), true) = (&self.kernel_log, ready.kernel_log) {
            // Read as soon as there is a record: the kernel's ring buffer
            // overwrites old ones.
            if let Ok(mut l) = log.try_lock() {
                l.poll();
            }
        }
        for &pid in &tree.exited {
            // A member not memprobe's own child is seen to die of a signal
            // only while it is a zombie (cheap: only when one ends).
            let status = self.zombies.ended(pid, now);
            self.rec.exited(pid, now, status);
            if let Some(k) = self.kinds.as_mut() {
                k.ended(pid);
            }
        }
        if let Ok(x) = self.exits.as_mut() {
            // Every member seen gone at this tick has its record queued
            // already (sent before its memory was freed).
            let rec = &mut self.rec;
            if ready.exits {
                x.drain(|e| rec.exit_hwm(e.tgid, e.hwm, e.name.as_deref(), now));
            }
            rec.forget_ended_before(now.saturating_sub(EXIT_RECORD_GRACE_NS));
        }
        for (pid, seen) in &tree.changed {
            let peak = self
                .rec
                .observe(*pid, seen.rss, seen.status.as_deref(), seen.kinds, now);
            if let (true, Some(k)) = (peak, self.kinds.as_mut()) {
                k.peak(*pid);
            }
        }
        let tree_rss = tree.rss;
        if self.kinds.is_some() {
            self.kinds_tick(tree_rss, now);
        }
        let processes = tree.processes;
        let pss = self.pss.as_mut().map_or_else(PssPoint::default, |p| {
            let pids: Vec<u32> = self.tree.pids().collect();
            p.tick(&pids, self.tree.root(), now)
        });

        let cgroup = self.cgroup.as_mut().and_then(|c| {
            let rec = self.rec.cgroup.as_mut()?;
            // The limit is set by hand, rarely: read with the slow sweep.
            let sample = if slow {
                c.read().ok().inspect(|s| self.cgroup_limit = s.limit)
            } else {
                c.read_used().ok().map(|used| memprobe_core::Sample {
                    used,
                    limit: self.cgroup_limit,
                    ..memprobe_core::Sample::default()
                })
            };
            rec.observe(sample, now)
        });
        if let Some(c) = self.cgroup.as_mut() {
            // One small pread: the OOM-kill counters, for the verdict.
            self.rec.oom_counters.observe(now, c.oom_events());
        }
        let readings = if self.rec.gpus.is_empty() {
            None
        } else {
            gpu_readings::read_gpus().ok()
        };
        let gpus = if self.rec.gpus.is_empty() {
            Vec::new()
        } else {
            let tree = &self.tree;
            self.rec
                .gpus
                .iter_mut()
                .map(|series| series.observe(readings.as_deref(), &|pid| tree.contains(pid), now))
                .collect()
        };
        let gpu_exact = self
            .exact
            .as_mut()
            .map(|w| w.tick(readings.as_deref(), exact_peaks.unwrap_or_default()))
            .unwrap_or_default();
        self.rec.add_point(Point {
            t_ns: now,
            tree_rss,
            processes,
            cgroup,
            gpus,
            gpu_exact,
            tree_pss: pss.pss,
            tree_uss: pss.uss,
        });
        if let Some(l) = &self.live {
            l.publish(tree_rss, processes, cgroup);
        }
    }
}
