//! `memprobe run --gpu-exact`: exact GPU memory of the whole process tree,
//! from the driver-API interposer (`libmemprobe_interpose.so`, read through
//! the `memprobe-interpose-reader` crate).
//!
//! Before the child starts, the run gets a private directory of counter
//! regions and a *tree region* in it (`memprobe_interpose_reader::tree_counter`); the child
//! starts with the interposer appended to `LD_PRELOAD` and the directory in
//! `MEMPROBE_GPU_EXACT_DIR`, which every descendant inherits across fork and
//! exec. Every interposed process then counts its device memory at each
//! allocation and free into a region of its own *and* into the tree's
//! counter, so:
//!
//! - a process's exact peak per device is its region's lifetime peak;
//! - the tree's exact peak per device is the tree counter's lifetime peak:
//!   the largest *sum* at any instant, not the sum of the processes' peaks
//!   (an upper bound only) nor a sampled sum;
//! - each timeline point carries the tree's exact peak *during* that
//!   interval (a mark of memprobe's own on the tree region, taken at every
//!   tick), so a spike of microseconds shows on the chart.
//!
//! At each tick the sampling thread lists the directory, claims a mark in
//! each new region (a held mark keeps a dead process's region from being
//! reclaimed by the processes of the tree), and settles each process that
//! ended: what it still held (freed by the driver at exit, with no call the
//! interposer sees) leaves the tree's counter, and its final figures are
//! kept before its file is removed.

use crate::commands::run::gpu_origins::OriginsAtPeak;
use crate::commands::run::tree_origins::{self, Found, Member, Spans, TreeOrigins};
use crate::gpu_readings::GpuReading;
use memprobe_interpose_reader::{self as interpose, tree_counter, Counter, Mark, Region};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The interposer's file name.
pub(crate) const LIBRARY_NAME: &str = "libmemprobe_interpose.so";
/// Names the interposer when it is not next to the `memprobe` binary.
pub(crate) const LIBRARY_ENV: &str = "MEMPROBE_INTERPOSE_LIBRARY";

/// The interposer as the Python package carries it (`pip install`:
/// `memprobe/_lib/`, tagged like the package's other library).
const PYTHON_LIBRARY_NAME: &str = "libmemprobe_interpose.abi3.so";

/// Finds the interposer: next to the `memprobe` binary, then
/// `$MEMPROBE_INTERPOSE_LIBRARY`, then the install prefix's `lib/`
/// (`<prefix>/bin/memprobe` → `<prefix>/lib/`), then the Python package
/// installed in that prefix (`pip install` puts the command in
/// `<prefix>/bin` and the interposer in
/// `<prefix>/lib/pythonX.Y/{site,dist}-packages/memprobe/_lib/`). The error
/// names every place searched.
pub(crate) fn find_library() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().ok();
    find_library_in(
        exe.as_deref().and_then(Path::parent),
        std::env::var_os(LIBRARY_ENV),
    )
}

/// [`find_library`] for a binary in `exe_dir` and a value of
/// [`LIBRARY_ENV`].
fn find_library_in(exe_dir: Option<&Path>, named: Option<OsString>) -> Result<PathBuf, String> {
    let mut searched = Vec::new();
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    if let Some(d) = exe_dir {
        let p = d.join(LIBRARY_NAME);
        candidates.push((p.clone(), p.display().to_string()));
    }
    match named {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            candidates.push((p.clone(), format!("{} ({LIBRARY_ENV})", p.display())));
        }
        _ => searched.push(format!("{LIBRARY_ENV} (not set)")),
    }
    if let Some(d) = exe_dir.and_then(Path::parent) {
        let p = d.join("lib").join(LIBRARY_NAME);
        candidates.push((p.clone(), p.display().to_string()));
        let python = python_packages(d);
        if python.is_empty() {
            searched.push(format!(
                "{}/lib/python3*/{{site,dist}}-packages/memprobe/_lib/{PYTHON_LIBRARY_NAME} (no Python package)",
                d.display()
            ));
        }
        candidates.extend(
            python
                .into_iter()
                .map(|p| (p.clone(), p.display().to_string())),
        );
    }
    for (p, shown) in candidates {
        if p.is_file() {
            let abs = p.canonicalize().map_err(|e| format!("{shown}: {e}"))?;
            let text = abs.to_string_lossy();
            // LD_PRELOAD splits on spaces and colons.
            if text.contains([' ', ':']) || abs.to_str().is_none() {
                return Err(format!(
                    "--gpu-exact: the interposer's path {text} holds a space or a colon \
                     (LD_PRELOAD cannot name it); move it or set {LIBRARY_ENV}"
                ));
            }
            return Ok(abs);
        }
        searched.push(shown);
    }
    searched.sort_by_key(|s| s.starts_with(LIBRARY_ENV));
    Err(format!(
        "--gpu-exact: the GPU interposer {LIBRARY_NAME} was not found (searched {}); \
         build it with `cargo build --release -p memprobe-interpose-preload` or install \
         it with `make install`, or name it with {LIBRARY_ENV}=/path/to/{LIBRARY_NAME}",
        searched.join(", ")
    ))
}

/// Where the Python package installed under `prefix` keeps the interposer,
/// for every Python version found there (newest name first).
fn python_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut versions: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        versions.sort();
        for v in versions.iter().rev() {
            for packages in ["site-packages", "dist-packages"] {
                let p = v.join(packages).join("memprobe").join("_lib");
                if p.is_dir() {
                    found.push(p.join(PYTHON_LIBRARY_NAME));
                }
            }
        }
    }
    found
}

/// The run's directory of regions: private (0700), named for this memprobe
/// process, in shared memory where there is some.
fn run_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    base.join(interpose::run_dir_name(uid, std::process::id()))
}

/// The interposer set up for one run; the directory is removed on drop.
pub(crate) struct Injection {
    library: PathBuf,
    dir: PathBuf,
    tree: Arc<Region>,
    /// Frames of the call paths the interposer keeps (`--gpu-exact=stacks`).
    stacks: Option<usize>,
}

impl Injection {
    /// Finds the interposer and makes the run's directory and tree region.
    pub(crate) fn prepare(mode: crate::args::GpuExactMode) -> Result<Injection, String> {
        let library = find_library()?;
        let dir = run_dir();
        // A directory left by an earlier memprobe with this pid (killed
        // before it could clean up) is ours to replace.
        let _ = std::fs::remove_dir_all(&dir);
        let tree = Region::create_tree(&dir)
            .map_err(|e| format!("--gpu-exact: cannot set up {}: {e}", dir.display()))?;
        Ok(Injection {
            library,
            dir,
            tree,
            stacks: mode.stacks,
        })
    }

    /// The variables the child starts with (`None`: removed): the
    /// interposer appended to `LD_PRELOAD`, the run's directory, and no
    /// `MEMPROBE_GPU_EXACT=off` (the run asked for counting).
    pub(crate) fn env(&self) -> Vec<(OsString, Option<OsString>)> {
        let mut preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
        if !preload.is_empty() {
            preload.push(":");
        }
        preload.push(self.library.as_os_str());
        let mut env: Vec<(OsString, Option<OsString>)> = vec![
            ("LD_PRELOAD".into(), Some(preload)),
            (
                interpose::DIR_ENV.into(),
                Some(self.dir.as_os_str().to_owned()),
            ),
            (interpose::SWITCH_ENV.into(), None),
        ];
        if let Some(n) = self.stacks {
            env.push((
                "MEMPROBE_GPU_ORIGINS".into(),
                Some(format!("stacks:{n}").into()),
            ));
        }
        env
    }

    /// The reader the sampling thread polls.
    pub(crate) fn watcher(&self) -> Result<Watcher, String> {
        let mark = self
            .tree
            .mark()
            .map_err(|e| format!("--gpu-exact: the tree region: {e}"))?;
        Ok(Watcher {
            dir: self.dir.clone(),
            tree: Arc::clone(&self.tree),
            tree_mark: mark,
            watched: BTreeMap::new(),
            ended: Vec::new(),
            record: ExactRecord {
                library: self.library.display().to_string(),
                ..ExactRecord::default()
            },
        })
    }
}

impl Drop for Injection {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The last allocation of a process that failed with out-of-memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LastOom {
    /// The device it was asked on; null for page-locked host memory.
    pub(crate) device: Option<u32>,
    /// The bytes asked for.
    pub(crate) size_bytes: u64,
    /// The entry point that failed (`cuMemAlloc_v2`, ...), where recorded.
    pub(crate) api: Option<&'static str>,
    /// What that device (or pinned memory) held by origin when it failed
    /// (null without origins).
    pub(crate) held_by_origin: Option<crate::commands::run::gpu_origins::OriginsAtPeak>,
}

/// One process's exact figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExactProcess {
    pub(crate) pid: u32,
    /// Whether it ended before recording did.
    pub(crate) exited: bool,
    /// Per device ordinal: the highest bytes it held at once.
    pub(crate) peak: Vec<u64>,
    /// Per device ordinal: what it held at its end (or at the last tick).
    pub(crate) end: Vec<u64>,
    /// Pinned host memory: the highest bytes held at once.
    pub(crate) host_pinned_peak: u64,
    /// Allocations that failed with out-of-memory.
    pub(crate) oom_failures: u64,
    /// The last of them.
    pub(crate) last_oom: Option<LastOom>,
    /// When the last of them failed (`CLOCK_MONOTONIC` ns), if recorded.
    pub(crate) last_oom_mono_ns: Option<u64>,
    /// The same, in nanoseconds since the timeline's zero (set when the
    /// recording ends: [`ExactRecord::place_in_run`]).
    pub(crate) last_oom_run_ns: Option<u64>,
    /// Allocations that passed through uncounted, and their bytes.
    pub(crate) not_counted_calls: u64,
    pub(crate) not_counted_bytes: u64,
    /// Per device ordinal: NVML's figure for this process at the last tick
    /// that had both readings (`None`: NVML never listed it there).
    pub(crate) nvml_used: Vec<Option<u64>>,
    /// Per device ordinal: NVML's figure minus what the interposer counted
    /// at that tick: the context and the driver's own reservations, which
    /// no call reveals.
    pub(crate) context: Vec<Option<u64>>,
    /// The process's executable (for naming "the program" among origins).
    pub(crate) exe: Option<String>,
    /// Per device ordinal: the bytes by origin at its peak there.
    pub(crate) origins_at_peak: Vec<Option<crate::commands::run::gpu_origins::OriginsAtPeak>>,
    /// Per device ordinal: the bytes by call path at its peak there
    /// (`--gpu-exact=stacks`; empty without).
    pub(crate) stacks_at_peak: Vec<Option<memprobe_interpose_reader::stacks::PeakStacks>>,
}

impl ExactProcess {
    /// Folds in NVML's figure of `used` bytes on device `d`, read at the
    /// same tick as the interposer's counters.
    fn observe_nvml(&mut self, d: usize, used: u64) {
        if self.nvml_used.len() <= d {
            self.nvml_used.resize(d + 1, None);
            self.context.resize(d + 1, None);
        }
        let counted = self.end.get(d).copied().unwrap_or(0);
        self.nvml_used[d] = Some(used);
        // NVML reads a moment apart and rounds to pages: never below 0.
        self.context[d] = Some(used.saturating_sub(counted));
    }
}

impl ExactRecord {
    /// Places the processes' out-of-memory times on the timeline, whose
    /// zero is `t0_mono_ns` on `CLOCK_MONOTONIC`.
    pub(crate) fn place_in_run(&mut self, t0_mono_ns: u64) {
        self.t0_mono_ns = t0_mono_ns;
        for s in &mut self.tree_spans {
            s.place_in_run(t0_mono_ns);
        }
        for p in &mut self.processes {
            p.last_oom_run_ns = p.last_oom_mono_ns.map(|t| t.saturating_sub(t0_mono_ns));
        }
    }
}

/// The tree's breakdowns by origin (tree_origins.rs says how they are
/// known).
impl ExactRecord {
    /// What held the tree's exact peak on device `d`, or why that is not
    /// known (`Ok(None)`: the tree never used the device).
    pub(crate) fn origins_at_tree_peak(
        &self,
        d: usize,
    ) -> Result<Option<TreeOrigins>, &'static str> {
        let peak = self.tree_peak.get(d).copied().unwrap_or(0);
        if peak == 0 {
            return Ok(None);
        }
        // One process held it all: the others held nothing then. The
        // lowest pid first: a tie of two processes is either's moment.
        if let Some(p) = self
            .processes
            .iter()
            .find(|p| p.peak.get(d).copied() == Some(peak))
        {
            let o = p
                .origins_at_peak
                .get(d)
                .cloned()
                .flatten()
                .filter(|o| o.peak_bytes == peak)
                .ok_or(tree_origins::NOT_KEPT)?;
            let at_s = (o.at_mono_ns > 0 && self.t0_mono_ns > 0)
                .then(|| o.at_mono_ns.saturating_sub(self.t0_mono_ns) as f64 / 1e9);
            return Ok(Some(TreeOrigins {
                origins: o,
                at_s,
                found: Found::OneProcess,
                pid: Some(p.pid),
                phase: None,
            }));
        }
        let (span, t) = self
            .tree_spans
            .get(d)
            .and_then(|s| s.at(peak, 0, u64::MAX))
            .ok_or(tree_origins::NOT_SEEN)?;
        Ok(Some(TreeOrigins {
            origins: OriginsAtPeak {
                peak_bytes: span.total,
                by_origin: span.by_origin.clone(),
                at_mono_ns: 0,
            },
            at_s: Some(t as f64 / 1e9),
            found: Found::AtTick,
            pid: None,
            phase: None,
        }))
    }

    /// The memory NVML shows for the tree's processes on device `d` beyond
    /// what the interposer counted: the sum of each process's context
    /// figure (sampled at the last tick NVML listed it); `None` when a
    /// process that used the device has none.
    pub(crate) fn tree_context(&self, d: usize) -> Option<u64> {
        let users: Vec<_> = self
            .processes
            .iter()
            .filter(|p| p.peak.get(d).is_some_and(|&b| b > 0))
            .collect();
        if users.is_empty() {
            return None;
        }
        users
            .iter()
            .map(|p| p.context.get(d).copied().flatten())
            .sum()
    }
}

/// What the run's interposed processes held, exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExactRecord {
    pub(crate) library: String,
    /// Per device ordinal: the tree's exact peak (the largest sum at once).
    pub(crate) tree_peak: Vec<u64>,
    /// Per device ordinal: the tree's bytes at the end.
    pub(crate) tree_end: Vec<u64>,
    /// The tree's pinned host memory peak.
    pub(crate) tree_host_pinned_peak: u64,
    /// By pid.
    pub(crate) processes: Vec<ExactProcess>,
    /// Per device ordinal: the tree seen whole by origin at its interval
    /// peaks (tree_origins.rs), times on the run's timeline once placed.
    pub(crate) tree_spans: Vec<Spans>,
    /// The timeline's zero on `CLOCK_MONOTONIC` (0 until placed).
    pub(crate) t0_mono_ns: u64,
}

struct Watched {
    region: Arc<Region>,
    /// Held while the region is read: keeps it from being reclaimed.
    _mark: Option<Mark>,
    path: PathBuf,
    figures: ExactProcess,
}

/// Device ordinals (dense, 0..n) of the devices a region counted on.
fn devices_of(region: &Region) -> usize {
    region
        .counters_seen()
        .into_iter()
        .filter_map(|c| match c {
            Counter::Device(d) => Some(d as usize + 1),
            Counter::HostPinned => None,
        })
        .max()
        .unwrap_or(0)
}

/// Reads the run's regions at each tick (on the sampling thread).
pub(crate) struct Watcher {
    dir: PathBuf,
    tree: Arc<Region>,
    tree_mark: Mark,
    watched: BTreeMap<u32, Watched>,
    /// Processes that ended, their final figures.
    ended: Vec<ExactProcess>,
    record: ExactRecord,
}

impl Watcher {
    /// The tree's exact peak per device since the last call: taken first
    /// at a tick, right when the tick's time is, so that an allocation
    /// made while the tick reads everything else (a phase that began
    /// meanwhile) counts at the next tick, not at this one's time.
    pub(crate) fn take_peaks(&mut self) -> Vec<u64> {
        let n = devices_of(&self.tree);
        (0..n as u32)
            .map(|d| self.tree_mark.take(Counter::Device(d)))
            .collect()
    }

    /// The rest of a tick, with the `peaks` [`Watcher::take_peaks`] took at
    /// its start: new processes' regions claimed, every process's figures
    /// read (with NVML's per-process figures of the same tick, `gpus`, for
    /// the context memory no call reveals), ended processes settled;
    /// returns `peaks`.
    pub(crate) fn tick(&mut self, gpus: Option<&[GpuReading]>, peaks: Vec<u64>) -> Vec<u64> {
        if let Ok(list) = interpose::processes(&self.dir) {
            for e in list {
                if self.watched.contains_key(&e.pid) {
                    continue;
                }
                // A region still being set up (no magic yet) is opened at
                // a later tick. The file of an ended process is removed
                // below, so a pid seen again is a new process.
                let Ok(region) = Region::open_path(&e.path) else {
                    continue;
                };
                let mark = region.mark().ok();
                self.watched.insert(
                    e.pid,
                    Watched {
                        region,
                        _mark: mark,
                        path: e.path,
                        figures: ExactProcess {
                            pid: e.pid,
                            exe: std::fs::read_link(format!("/proc/{}/exe", e.pid))
                                .ok()
                                .map(|p| p.display().to_string()),
                            ..ExactProcess::default()
                        },
                    },
                );
            }
        }
        let mut gone = Vec::new();
        for (&pid, w) in &mut self.watched {
            read_figures(&w.region, &mut w.figures);
            // Devices are matched by ordinal: NVML's as memprobe numbers
            // them, the interposer's as the process does (the same unless
            // it changed CUDA_VISIBLE_DEVICES).
            for g in gpus.unwrap_or_default() {
                for p in g.processes.iter().filter(|p| p.pid == pid) {
                    if let Some(used) = p.used_bytes {
                        w.figures.observe_nvml(g.index as usize, used);
                    }
                }
            }
            if !w.region.alive() {
                // What it still held went with it.
                tree_counter::settle(self.tree.layout(), w.region.layout());
                w.figures.exited = true;
                gone.push(pid);
            }
        }
        for pid in gone {
            if let Some(w) = self.watched.remove(&pid) {
                let _ = std::fs::remove_file(&w.path);
                self.ended.push(w.figures);
            }
        }
        let n = peaks.len();
        // The tree's split by origin where it stands at those peaks.
        let now = memprobe_core::monotonic_ns();
        let members: Vec<Member<'_>> = self
            .watched
            .iter()
            .map(|(&pid, w)| Member {
                pid,
                region: &w.region,
                exe: w.figures.exe.as_deref(),
            })
            .collect();
        let spans = &mut self.record.tree_spans;
        if spans.len() < n {
            spans.resize_with(n, Spans::default);
        }
        for (d, &p) in peaks.iter().enumerate() {
            spans[d].tick(&self.tree, d as u32, p, &members, now);
        }
        peaks
    }

    /// The figures after the last tick.
    pub(crate) fn finish(mut self) -> ExactRecord {
        let n = devices_of(&self.tree);
        let t = |c| self.tree.read(c);
        self.record.tree_peak = (0..n as u32)
            .map(|d| t(Counter::Device(d)).lifetime_peak)
            .collect();
        self.record.tree_end = (0..n as u32)
            .map(|d| t(Counter::Device(d)).current)
            .collect();
        self.record.tree_host_pinned_peak = t(Counter::HostPinned).lifetime_peak;
        let mut all = std::mem::take(&mut self.ended);
        all.extend(
            std::mem::take(&mut self.watched)
                .into_values()
                .map(|w| w.figures),
        );
        all.sort_by_key(|p| p.pid);
        self.record.processes = all;
        self.record
    }
}

fn read_figures(region: &Region, f: &mut ExactProcess) {
    let n = devices_of(region);
    let peak: Vec<u64> = (0..n as u32)
        .map(|d| region.read(Counter::Device(d)).lifetime_peak)
        .collect();
    // The breakdown is read again only when a peak rose.
    if peak != f.peak || f.origins_at_peak.len() != n {
        f.origins_at_peak = crate::commands::run::gpu_origins::read(region, n, f.exe.as_deref());
        f.stacks_at_peak = crate::commands::run::gpu_stacks::read(region, n);
    }
    f.peak = peak;
    f.end = (0..n as u32)
        .map(|d| region.read(Counter::Device(d)).current)
        .collect();
    f.host_pinned_peak = region.read(Counter::HostPinned).lifetime_peak;
    let oom = region.last_oom();
    f.oom_failures = oom.as_ref().map_or(0, |o| o.events);
    let held = region.oom_origins();
    f.last_oom = oom.map(|o| LastOom {
        device: match o.counter {
            Counter::Device(d) => Some(d),
            Counter::HostPinned => None,
        },
        size_bytes: o.size,
        api: o.api,
        held_by_origin: held
            .filter(|(c, _)| *c == o.counter)
            .map(|(_, b)| crate::commands::run::gpu_origins::named(b, f.exe.as_deref())),
    });
    f.last_oom_mono_ns = oom.and_then(|o| o.at_ns);
    let nc = region.not_counted();
    f.not_counted_calls = nc.calls;
    f.not_counted_bytes = nc.bytes;
}

/// `gpu_exact` in the JSON document.
#[derive(Debug, Serialize)]
pub(crate) struct GpuExactReport {
    pub(crate) library: String,
    pub(crate) peak_fidelity: &'static str,
    /// Allocations of the tree that failed with out-of-memory, in all.
    pub(crate) oom_failures: u64,
    pub(crate) devices: Vec<ExactDeviceReport>,
    pub(crate) host_pinned_tree_peak_bytes: u64,
    pub(crate) processes: Vec<ExactProcessReport>,
}

/// One device's exact figures for the tree.
#[derive(Debug, Serialize)]
pub(crate) struct ExactDeviceReport {
    pub(crate) index: u32,
    pub(crate) tree_peak_bytes: u64,
    pub(crate) tree_end_bytes: u64,
    /// The largest single-process peak on this device, and whose.
    pub(crate) max_process_peak_bytes: u64,
    pub(crate) max_process_pid: Option<u32>,
    /// What held the tree's peak, by origin (null: none, see
    /// `origins_at_tree_peak_unknown`).
    pub(crate) origins_at_tree_peak: Option<TreeOrigins>,
    /// Why there is no breakdown of a peak above 0.
    pub(crate) origins_at_tree_peak_unknown: Option<&'static str>,
    /// NVML's figures for the tree's processes minus what was counted
    /// (sampled; null without every user's NVML figure).
    pub(crate) context_bytes: Option<u64>,
}

/// One process's exact figures.
#[derive(Debug, Serialize)]
pub(crate) struct ExactProcessReport {
    pub(crate) pid: u32,
    pub(crate) exited: bool,
    pub(crate) peak_bytes: Vec<u64>,
    pub(crate) end_bytes: Vec<u64>,
    pub(crate) host_pinned_peak_bytes: u64,
    pub(crate) oom_failures: u64,
    /// The last allocation that failed with out-of-memory; null for none.
    pub(crate) last_oom: Option<LastOom>,
    /// When the last out-of-memory failure happened, seconds since the
    /// start (null: none, or its time unknown).
    pub(crate) last_oom_at_s: Option<f64>,
    pub(crate) not_counted_calls: u64,
    pub(crate) not_counted_bytes: u64,
    /// Per device ordinal: NVML's figure for the process (null: not listed).
    pub(crate) nvml_used_bytes: Vec<Option<u64>>,
    /// Per device ordinal: NVML's figure minus the counted bytes, at the
    /// same tick: context memory (null without an NVML figure).
    pub(crate) context_bytes: Vec<Option<u64>>,
    /// Per device ordinal: the bytes by origin at the process's exact peak
    /// there (null: none kept, e.g. MEMPROBE_GPU_ORIGINS=off).
    pub(crate) origins_at_peak: Vec<Option<crate::commands::run::gpu_origins::OriginsAtPeak>>,
    /// Per device ordinal: the bytes by call path at that peak
    /// (`--gpu-exact=stacks`; null where none are kept), bounded.
    #[serde(serialize_with = "crate::commands::run::gpu_stacks::serialize_at_peak")]
    pub(crate) stacks_at_peak: Vec<Option<memprobe_interpose_reader::stacks::PeakStacks>>,
}

impl GpuExactReport {
    /// The JSON part of `rec`, with every per-device array `devices` long.
    pub(crate) fn new(rec: &ExactRecord) -> GpuExactReport {
        let n = rec
            .processes
            .iter()
            .map(|p| p.peak.len().max(p.nvml_used.len()))
            .chain([rec.tree_peak.len()])
            .max()
            .unwrap_or(0);
        let pad = |v: &[u64]| {
            let mut v = v.to_vec();
            v.resize(n, 0);
            v
        };
        let pad_opt = |v: &[Option<u64>]| {
            let mut v = v.to_vec();
            v.resize(n, None);
            v
        };
        let devices = (0..n)
            .map(|d| {
                let top = rec
                    .processes
                    .iter()
                    .filter_map(|p| Some((p.peak.get(d).copied()?, p.pid)))
                    .filter(|(b, _)| *b > 0)
                    .max_by_key(|(b, pid)| (*b, std::cmp::Reverse(*pid)));
                let at = rec.origins_at_tree_peak(d);
                ExactDeviceReport {
                    index: d as u32,
                    tree_peak_bytes: rec.tree_peak.get(d).copied().unwrap_or(0),
                    tree_end_bytes: rec.tree_end.get(d).copied().unwrap_or(0),
                    max_process_peak_bytes: top.map_or(0, |t| t.0),
                    max_process_pid: top.map(|t| t.1),
                    origins_at_tree_peak: at.clone().ok().flatten(),
                    origins_at_tree_peak_unknown: at.err(),
                    context_bytes: rec.tree_context(d),
                }
            })
            .collect();
        GpuExactReport {
            library: rec.library.clone(),
            peak_fidelity: "exact",
            oom_failures: rec.processes.iter().map(|p| p.oom_failures).sum(),
            devices,
            host_pinned_tree_peak_bytes: rec.tree_host_pinned_peak,
            processes: rec
                .processes
                .iter()
                .map(|p| ExactProcessReport {
                    pid: p.pid,
                    exited: p.exited,
                    peak_bytes: pad(&p.peak),
                    end_bytes: pad(&p.end),
                    host_pinned_peak_bytes: p.host_pinned_peak,
                    oom_failures: p.oom_failures,
                    last_oom: p.last_oom.clone(),
                    last_oom_at_s: p
                        .last_oom_run_ns
                        .filter(|_| p.oom_failures > 0)
                        .map(|t| t as f64 / 1e9),
                    not_counted_calls: p.not_counted_calls,
                    not_counted_bytes: p.not_counted_bytes,
                    nvml_used_bytes: pad_opt(&p.nvml_used),
                    context_bytes: pad_opt(&p.context),
                    origins_at_peak: {
                        let mut v = p.origins_at_peak.clone();
                        v.resize(n, None);
                        v
                    },
                    stacks_at_peak: {
                        let mut v = p.stacks_at_peak.clone();
                        v.resize(n, None);
                        v
                    },
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_pads_every_process_to_the_devices_seen() {
        let rec = ExactRecord {
            library: "/x/libmemprobe_interpose.so".into(),
            tree_peak: vec![10, 0, 7],
            tree_end: vec![0, 0, 7],
            tree_host_pinned_peak: 3,
            processes: vec![
                ExactProcess {
                    pid: 5,
                    exited: true,
                    peak: vec![6],
                    end: vec![0],
                    ..ExactProcess::default()
                },
                ExactProcess {
                    pid: 9,
                    peak: vec![6, 0, 7],
                    end: vec![0, 0, 7],
                    ..ExactProcess::default()
                },
            ],
            ..ExactRecord::default()
        };
        let r = GpuExactReport::new(&rec);
        assert_eq!(r.devices.len(), 3);
        assert_eq!(r.processes[0].peak_bytes, vec![6, 0, 0]);
        assert_eq!(r.devices[0].tree_peak_bytes, 10);
        // A tie goes to the lower pid.
        assert_eq!(r.devices[0].max_process_pid, Some(5));
        assert_eq!(r.devices[1].max_process_pid, None);
        assert_eq!(r.devices[2].max_process_pid, Some(9));
    }

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("memprobe-cli-find-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("bin")).unwrap();
        d
    }

    #[test]
    fn the_library_is_searched_beside_the_binary_then_named_then_in_lib() {
        let d = scratch("order");
        let bin = d.join("bin");
        // Nothing anywhere: every place is named.
        let e = find_library_in(Some(&bin), None).unwrap_err();
        assert!(
            e.contains(&bin.join(LIBRARY_NAME).display().to_string()),
            "{e}"
        );
        assert!(e.contains(&format!("{LIBRARY_ENV} (not set)")), "{e}");
        assert!(
            e.contains(&d.join("lib").join(LIBRARY_NAME).display().to_string()),
            "{e}"
        );
        let e = find_library_in(Some(&bin), Some("/nonexistent/x.so".into())).unwrap_err();
        assert!(
            e.contains(&format!("/nonexistent/x.so ({LIBRARY_ENV})")),
            "{e}"
        );
        // The install prefix's lib/.
        std::fs::create_dir_all(d.join("lib")).unwrap();
        std::fs::write(d.join("lib").join(LIBRARY_NAME), b"").unwrap();
        let found = find_library_in(Some(&bin), None).unwrap();
        assert!(found.ends_with(format!("lib/{LIBRARY_NAME}")), "{found:?}");
        // A named one comes before it.
        let named = d.join("named.so");
        std::fs::write(&named, b"").unwrap();
        let found = find_library_in(Some(&bin), Some(named.clone().into())).unwrap();
        assert_eq!(found, named.canonicalize().unwrap());
        // Beside the binary comes first.
        std::fs::write(bin.join(LIBRARY_NAME), b"").unwrap();
        let found = find_library_in(Some(&bin), Some(named.into())).unwrap();
        assert!(found.ends_with(format!("bin/{LIBRARY_NAME}")), "{found:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_python_packages_copy_is_found_from_the_venvs_bin() {
        let d = scratch("venv");
        let bin = d.join("bin");
        let e = find_library_in(Some(&bin), None).unwrap_err();
        assert!(e.contains("(no Python package)"), "{e}");
        let lib = d.join("lib/python3.11/site-packages/memprobe/_lib");
        std::fs::create_dir_all(&lib).unwrap();
        let e = find_library_in(Some(&bin), None).unwrap_err();
        assert!(
            e.contains(&lib.join(PYTHON_LIBRARY_NAME).display().to_string()),
            "{e}"
        );
        std::fs::write(lib.join(PYTHON_LIBRARY_NAME), b"").unwrap();
        let found = find_library_in(Some(&bin), None).unwrap();
        assert_eq!(found, lib.join(PYTHON_LIBRARY_NAME).canonicalize().unwrap());
        // The prefix's lib/ comes first.
        std::fs::write(d.join("lib").join(LIBRARY_NAME), b"").unwrap();
        let found = find_library_in(Some(&bin), None).unwrap();
        assert!(found.ends_with(format!("lib/{LIBRARY_NAME}")), "{found:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_path_ld_preload_cannot_carry_is_refused() {
        let d = scratch("space");
        let odd = d.join("with space.so");
        std::fs::write(&odd, b"").unwrap();
        let e = find_library_in(None, Some(odd.into())).unwrap_err();
        assert!(e.contains("space or a colon"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
