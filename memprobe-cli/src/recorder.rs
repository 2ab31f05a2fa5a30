//! The sampling thread of `run`: at every tick (absolute deadlines, no drift)
//! it finds the child's process tree, reads each process's status (resident
//! set and kernel high-water mark in one `pread`), the cgroup and the GPUs,
//! and appends a point to the timeline.
//!
//! A process, once seen in the tree, is followed until it exits even if it
//! leaves the tree (reparented when its parent exits). Its exact peak is the
//! last `VmHWM` read while it lived; a spike in the last interval before a
//! worker exits is the one thing this can miss (the direct child is covered
//! by `wait4`'s `ru_maxrss`, see [`crate::child::reap`]).

use crate::gpu::{self, GpuReading};
use crate::live::LiveState;
use crate::proc_status::ProcStatus;
use crate::recording::{
    CgroupRecord, GpuSeries, Point, ProcessRecord, Recording, MAX_PROCESS_RECORDS,
};
use crate::tree_walk::TreeWalker;
use memprobe_core::cgroup::CgroupSampler;
use memprobe_core::Sampler;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What the sampling thread starts from.
pub(crate) struct Setup {
    /// The child's pid: the root of the tree.
    pub(crate) root: u32,
    pub(crate) interval: Duration,
    /// When the child was spawned: time zero of the timeline.
    pub(crate) t0: Instant,
    /// The container's cgroup, or why there is none.
    pub(crate) cgroup: Result<CgroupSampler, String>,
    /// The GPUs at start, or why there are none.
    pub(crate) gpus: Result<Vec<GpuReading>, String>,
    /// Where the live status line reads from, if there is one.
    pub(crate) live: Option<Arc<LiveState>>,
}

/// The running sampling thread.
pub(crate) struct Recorder {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Recording>,
}

impl Recorder {
    /// Starts sampling; the first sample is taken at once.
    pub(crate) fn start(setup: Setup) -> io::Result<Recorder> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("memprobe-sampler".into())
            .spawn(move || State::new(setup).run(&s))?;
        Ok(Recorder { stop, handle })
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

struct Live {
    status: ProcStatus,
    record: ProcessRecord,
    /// Threads at the last read.
    threads: u32,
}

struct State {
    walker: TreeWalker,
    interval: Duration,
    t0: Instant,
    cgroup: Option<CgroupSampler>,
    gpus_on: bool,
    live_state: Option<Arc<LiveState>>,
    live: HashMap<u32, Live>,
    finished: Vec<ProcessRecord>,
    buf: Vec<u8>,
    rec: Recording,
}

impl State {
    fn new(setup: Setup) -> State {
        let mut rec = Recording::default();
        let cgroup = match setup.cgroup {
            Ok(c) => {
                let loc = c.location().clone();
                rec.cgroup = Some(CgroupRecord {
                    version: loc.version,
                    path: loc.dir.display().to_string(),
                    limit: None,
                    start: None,
                    end: None,
                    sampled_peak: None,
                    exact_peak: None,
                    errors: 0,
                });
                Some(c)
            }
            Err(why) => {
                rec.unavailable.insert("cgroup".into(), why);
                None
            }
        };
        let gpus_on = match setup.gpus {
            Ok(list) => {
                rec.gpus = list
                    .into_iter()
                    .map(|g| GpuSeries {
                        index: g.index,
                        name: g.name,
                        uuid: g.uuid,
                        total: g.total_bytes,
                        peak: None,
                        tree_peak: None,
                    })
                    .collect();
                !rec.gpus.is_empty()
            }
            Err(why) => {
                rec.unavailable.insert("gpus".into(), why);
                false
            }
        };
        State {
            walker: TreeWalker::new(setup.root),
            interval: setup.interval,
            t0: setup.t0,
            cgroup,
            gpus_on,
            live_state: setup.live,
            live: HashMap::new(),
            finished: Vec::new(),
            buf: vec![0; 4096],
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
        self.finalize()
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn tick(&mut self) {
        let now = self.now_ns();
        let mut tree_rss = 0u64;
        let mut procs = 0u32;

        // Processes already followed (in the tree or not any more).
        let mut gone = Vec::new();
        for (&pid, p) in self.live.iter_mut() {
            match p.status.read(&mut self.buf) {
                Some(r) => {
                    tree_rss += r.rss;
                    p.threads = r.threads;
                    update(&mut p.record, r, now);
                    procs += 1;
                }
                None => gone.push(pid),
            }
        }
        for pid in gone {
            self.walker.forget(pid);
            if let Some(p) = self.live.remove(&pid) {
                let mut record = p.record;
                record.exited = true;
                self.retire(record);
            }
        }
        // The tree now, with thread counts just read (a single-threaded
        // process costs one read).
        let live = &self.live;
        let tree = self
            .walker
            .walk(|pid| live.get(&pid).map(|l| l.threads), &mut self.buf);
        // Newcomers.
        for &pid in &tree {
            if self.live.contains_key(&pid) {
                continue;
            }
            let mut status = ProcStatus::open(pid);
            let Some(r) = status.read(&mut self.buf) else {
                continue; // exited already, or a zombie
            };
            let threads = r.threads;
            let mut record = ProcessRecord {
                pid,
                ppid: None,
                name: String::new(),
                first_seen_ns: now,
                last_seen_ns: now,
                exited: false,
                vmhwm: None,
                max_sampled_rss: 0,
                rusage_maxrss: None,
            };
            tree_rss += r.rss;
            update(&mut record, r, now);
            procs += 1;
            self.rec.processes_seen += 1;
            self.live.insert(
                pid,
                Live {
                    status,
                    record,
                    threads,
                },
            );
        }

        let cgroup = self.read_cgroup(now);
        let gpus = self.read_gpus(now, &tree);

        self.rec.samples += 1;
        self.rec.max_processes = self.rec.max_processes.max(procs);
        if self.rec.tree_peak.map_or(true, |(v, _)| tree_rss > v) {
            self.rec.tree_peak = Some((tree_rss, now));
        }
        self.rec.timeline.push(Point {
            t_ns: now,
            tree_rss,
            processes: procs,
            cgroup,
            gpus,
        });
        if let Some(l) = &self.live_state {
            l.publish(tree_rss, procs, cgroup);
        }
    }

    fn read_cgroup(&mut self, now: u64) -> Option<u64> {
        let sampler = self.cgroup.as_mut()?;
        let rec = self.rec.cgroup.as_mut()?;
        match sampler.read() {
            Ok(s) => {
                rec.limit = s.limit;
                rec.start.get_or_insert(s.used);
                rec.end = Some(s.used);
                if rec.sampled_peak.map_or(true, |(v, _)| s.used > v) {
                    rec.sampled_peak = Some((s.used, now));
                }
                Some(s.used)
            }
            Err(_) => {
                rec.errors += 1;
                None
            }
        }
    }

    fn read_gpus(&mut self, now: u64, tree: &[u32]) -> Vec<Option<u64>> {
        if !self.gpus_on {
            return Vec::new();
        }
        let Ok(readings) = gpu::read_gpus() else {
            return vec![None; self.rec.gpus.len()];
        };
        let in_tree: HashSet<u32> = tree.iter().chain(self.live.keys()).copied().collect();
        self.rec
            .gpus
            .iter_mut()
            .map(|series| {
                let r = readings.iter().find(|r| r.uuid == series.uuid)?;
                if series.peak.map_or(true, |(v, _)| r.used_bytes > v) {
                    series.peak = Some((r.used_bytes, now));
                }
                let tree_used: u64 = r
                    .processes
                    .iter()
                    .filter(|p| in_tree.contains(&p.pid))
                    .filter_map(|p| p.used_bytes)
                    .sum();
                series.tree_peak = Some(series.tree_peak.unwrap_or(0).max(tree_used));
                Some(r.used_bytes)
            })
            .collect()
    }

    /// Keeps an exited process's record, dropping the smallest exited one
    /// when too many are kept.
    fn retire(&mut self, record: ProcessRecord) {
        if self.finished.len() + self.live.len() >= MAX_PROCESS_RECORDS {
            if let Some((i, smallest)) = self
                .finished
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| r.peak().0)
            {
                if smallest.peak().0 >= record.peak().0 {
                    return;
                }
                self.finished.swap_remove(i);
            }
        }
        self.finished.push(record);
    }

    fn finalize(mut self) -> Recording {
        if let (Some(s), Some(rec)) = (self.cgroup.as_mut(), self.rec.cgroup.as_mut()) {
            rec.exact_peak = s.read_peak().ok().flatten();
        }
        let mut all = std::mem::take(&mut self.finished);
        all.extend(self.live.into_values().map(|l| l.record));
        all.sort_by_key(|r| (r.first_seen_ns, r.pid));
        self.rec.processes = all;
        self.rec
    }
}

fn update(record: &mut ProcessRecord, r: crate::proc_status::StatusReading, now: u64) {
    if record.name != r.name {
        record.name = r.name;
    }
    if r.ppid.is_some() {
        record.ppid = r.ppid;
    }
    record.vmhwm = Some(record.vmhwm.unwrap_or(0).max(r.hwm));
    record.max_sampled_rss = record.max_sampled_rss.max(r.rss);
    record.last_seen_ns = now;
}
