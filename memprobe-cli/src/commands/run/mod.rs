//! `memprobe run`: start the command, record its memory until it ends, print
//! the summary, write the outputs, and exit with the command's status.
//!
//! Order matters:
//! 1. reserve the output files (exit 2 before anything runs if one cannot
//!    be created);
//! 2. block the forwarded signals (every thread started later inherits the
//!    mask; the child starts with an empty one);
//! 3. with `--gpu-exact`, find the interposer and make the run's directory
//!    of counter regions (exit 2 before anything runs if the interposer is
//!    missing);
//! 4. open the cgroup and ask for GPUs; listen to the kernel's process
//!    events and open its log, become the tree's subreaper (all before the
//!    spawn: the command's first fork counts); spawn the child, start the
//!    signal, sampling and live-line threads;
//! 5. wait for the child to terminate without reaping it, take the last
//!    sample, stop forwarding, then reap it with `wait4` for its exact peak;
//!    read what the process events and the kernel's log still hold, reap
//!    the last orphans, and judge any OOM kill.

mod child;
pub(crate) mod cpu_cap;
mod event_filter;
mod exit_stats;
mod fd_limit;
mod gpu_exact;
mod gpu_origins;
pub(crate) mod gpu_stacks;
mod host_kinds;
mod html;
mod kernel_log;
mod live;
mod oom_kill;
mod orphans;
mod own_files;
mod phase_channel;
mod phase_log;
mod phase_report;
mod pid_map;
mod plot;
mod process_events;
mod process_lines;
mod ranks;
mod recording;
mod report;
mod sampling;
mod timeline;
mod timeline_csv;
mod torch_attribution;
mod tree_origins;
mod tree_pss;
mod tree_sampler;

use crate::args::RunArgs;
use crate::exit;
use crate::gpu_readings;
use crate::signals::{self, Forwarder, SigSet};
use crate::terminal::is_tty;
use crate::units;
use gpu_exact::{Injection, Watcher};
use kernel_log::KernelLog;
use live::{LiveLine, LiveState};
use memprobe_core::internal::sinks::AtomicFile;
use memprobe_core::{CgroupOptions, CgroupSampler, CgroupVersion};
use memprobe_metrics::Exporter;
use phase_channel::{PhaseChannel, Receiver};
use process_events::{Lifetimes, ProcessEvents};
use recording::Recording;
use report::{RunFacts, RunReport};
use sampling::{SamplingThread, Setup};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The reserved output files: each one's temporary file exists from before
/// the command starts, and is removed if memprobe ends without writing it.
struct Outputs {
    json: Option<AtomicFile>,
    csv: Option<AtomicFile>,
    plot: Option<AtomicFile>,
    html: Option<AtomicFile>,
}

impl Outputs {
    fn reserve(args: &RunArgs) -> Result<Outputs, String> {
        let named = [
            ("--json", &args.json),
            ("--csv", &args.csv),
            ("--plot", &args.plot),
            ("--html", &args.html),
        ];
        for (i, (a, pa)) in named.iter().enumerate() {
            for (b, pb) in &named[i + 1..] {
                if let (Some(x), Some(y)) = (pa, pb) {
                    if same_path(x, y) {
                        return Err(format!("{a} and {b} name the same file {}", x.display()));
                    }
                }
            }
        }
        if let Some(p) = &args.plot {
            if !p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
                return Err(format!(
                    "--plot {}: the chart is drawn as SVG only; name the file with .svg (e.g. {})",
                    p.display(),
                    p.with_extension("svg").display()
                ));
            }
        }
        let reserve = |what: &str, p: &Option<std::path::PathBuf>| {
            p.as_deref()
                .map(|p| AtomicFile::create(p).map_err(|e| format!("{what} {}", e.message())))
                .transpose()
        };
        Ok(Outputs {
            json: reserve("--json", &args.json)?,
            csv: reserve("--csv", &args.csv)?,
            plot: reserve("--plot", &args.plot)?,
            html: reserve("--html", &args.html)?,
        })
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.map_or_else(|| Path::new(".").canonicalize(), Path::canonicalize);
        dir.ok().map(|d| d.join(p.file_name().unwrap_or_default()))
    };
    a == b || matches!((canon(a), canon(b)), (Some(x), Some(y)) if x == y)
}

/// Opens the container's cgroup. With cgroup v2 the peak is reset for this
/// descriptor only (Linux ≥ 6.12), giving an exact peak over the run without
/// disturbing anyone; with v1 the reset would be cgroup-wide, so the peak is
/// sampled instead.
fn open_cgroup() -> Result<CgroupSampler, String> {
    let loc = memprobe_core::internal::cgroup::discover().map_err(|e| e.message().to_string())?;
    let reset_peak = loc.version == CgroupVersion::V2;
    CgroupSampler::at(loc, CgroupOptions { reset_peak }).map_err(|e| e.to_string())
}

/// Why `run` ends early: what to say (after `memprobe: `) and the status.
struct Stop {
    status: i32,
    message: String,
}

impl Stop {
    fn new(status: i32, message: impl Into<String>) -> Stop {
        Stop {
            status,
            message: message.into(),
        }
    }
}

pub(crate) fn main(args: RunArgs) -> i32 {
    match run(&args) {
        Ok(status) => status,
        Err(stop) => {
            crate::say::say!("memprobe: {}", stop.message);
            stop.status
        }
    }
}

/// The steps of the module's header, in order; the command's exit status,
/// or [`exit::FAILURE`] for a status 0 when an output was not written.
fn run(args: &RunArgs) -> Result<i32, Stop> {
    let Prepared {
        outputs,
        injection,
        exact,
        blocked,
    } = prepare(args)?;
    let running = start(args, injection.as_ref(), exact, blocked)?;
    let ended = running.end(args)?;
    let rep = judge(ended);
    crate::say::text(&report::summary(&rep, args.verbose));
    let written = outputs.write(&rep);
    // The run's directory of counter regions lives until here.
    drop(injection);
    let status = rep.exit.status;
    Ok(if !written && status == 0 {
        exit::FAILURE
    } else {
        status
    })
}

/// What is ready before anything runs (steps 1 to 3).
struct Prepared {
    outputs: Outputs,
    /// With `--gpu-exact`: the interposer and the run's counter regions.
    injection: Option<Injection>,
    exact: Option<Watcher>,
    /// The forwarded signals, blocked.
    blocked: SigSet,
}

/// Reserves the outputs, finds the interposer, blocks the forwarded
/// signals: a usage error stops here, before the command starts.
fn prepare(args: &RunArgs) -> Result<Prepared, Stop> {
    let outputs = Outputs::reserve(args).map_err(|m| Stop::new(exit::USAGE, m))?;
    let injection = args
        .gpu_exact
        .map(Injection::prepare)
        .transpose()
        .map_err(|m| Stop::new(exit::USAGE, m))?;
    let exact = injection
        .as_ref()
        .map(Injection::watcher)
        .transpose()
        .map_err(|m| Stop::new(exit::FAILURE, m))?;
    let blocked = SigSet::of(&signals::FORWARDED);
    blocked
        .block()
        .map_err(|e| Stop::new(exit::FAILURE, format!("cannot block signals: {e}")))?;
    Ok(Prepared {
        outputs,
        injection,
        exact,
        blocked,
    })
}

/// The command running, and everything that watches it.
struct Running {
    pid: u32,
    t0: Instant,
    /// `CLOCK_MONOTONIC` at the spawn, ns (Instant's clock).
    t0_monotonic_ns: u64,
    started_at_unix_s: f64,
    sampling: std::io::Result<SamplingThread>,
    phases: Result<Receiver, String>,
    forwarder: Option<Forwarder>,
    live: Option<LiveLine>,
    exporter: Option<Exporter>,
    events: Result<ProcessEvents, String>,
    kernel_log: Arc<Mutex<KernelLog>>,
    /// Processes memprobe had as children before the run (not the run's).
    inherited: Vec<u32>,
    attribution: Option<torch_attribution::AttributionDir>,
}

/// Step 4: everything that must see the command's first fork starts
/// before the spawn; then the command, and the threads that follow it.
fn start(
    args: &RunArgs,
    injection: Option<&Injection>,
    exact: Option<Watcher>,
    blocked: SigSet,
) -> Result<Running, Stop> {
    let cgroup = open_cgroup();
    let gpus = gpu_readings::read_gpus();
    let started_at_unix_s = units::unix_now_s();
    let mut env = injection.map(Injection::env).unwrap_or_default();
    // The command's trackers send their phases here (phase_channel.rs).
    let phases = PhaseChannel::bind();
    if let Ok(p) = &phases {
        env.push(p.env());
    }
    // Where the command's PyTorch attribution records go (read at the end).
    let attribution = torch_attribution::AttributionDir::prepare()
        .map_err(|e| crate::say::say!("memprobe: warning: no attribution directory: {e}"))
        .ok();
    env.extend(attribution.as_ref().map(|a| a.env()));
    // From before the spawn (a command that fills the container at once
    // must not find memprobe unshielded); the command gets its value back.
    let oom_score_adj = oom_kill::shield_self();
    // Every birth and death of the tree, and the kernel's record of its OOM
    // kills, from before the spawn: the command's first fork counts.
    let events = ProcessEvents::start();
    let exits = exit_stats::ExitStats::open();
    let kernel_log = Arc::new(Mutex::new(KernelLog::open()));
    let inherited = orphans::inherited();
    orphans::become_subreaper();
    // Room for three descriptors per process of a large tree; the command
    // gets the limit it would have had.
    let nofile = fd_limit::raise();
    let pid = child::spawn(&args.command, &env, oom_score_adj, nofile)
        .map_err(|e| Stop::new(e.status, e.message))?;
    let t0 = Instant::now();
    let t0_monotonic_ns = memprobe_core::monotonic_ns();
    // The same clock as Instant's (CLOCK_MONOTONIC), read at once: phase
    // times from the command map onto the timeline through it.
    let phases = phases.and_then(|p| p.start(t0_monotonic_ns));
    let forwarder = match Forwarder::start(blocked, pid as libc::pid_t, t0) {
        Ok(f) => Some(f),
        Err(e) => {
            crate::say::say!("memprobe: warning: signals will not be forwarded: {e}");
            None
        }
    };
    let live_state = (!args.no_live && is_tty(2)).then(|| Arc::new(LiveState::new()));
    let sampling = SamplingThread::start(Setup {
        root: pid,
        interval: args.interval,
        max_cpu: args.max_cpu,
        t0,
        cgroup,
        gpus,
        live: live_state.clone(),
        exact,
        pss: args.pss,
        kernel_log: Some(Arc::clone(&kernel_log)),
        inherited: inherited.clone(),
        feed: events.as_ref().ok().map(ProcessEvents::feed),
        exits,
        host_kinds: !args.no_host_kinds,
    });
    let live = live_state.and_then(|s| LiveLine::start(s, t0));
    let exporter = args.serve.and_then(|addr| {
        crate::commands::serve::start_for_tree(addr, pid)
            .map_err(|e| crate::say::say!("memprobe: warning: --serve: {e}"))
            .ok()
    });
    Ok(Running {
        pid,
        t0,
        t0_monotonic_ns,
        started_at_unix_s,
        sampling,
        phases,
        forwarder,
        live,
        exporter,
        events,
        kernel_log,
        inherited,
        attribution,
    })
}

/// What the run left, the command reaped.
struct Ended {
    recording: Recording,
    facts: RunFacts,
    lives: Result<Lifetimes, String>,
    kernel_log: KernelLog,
    t0_monotonic_ns: u64,
}

impl Running {
    /// Step 5: waits for the command to terminate, stops every watcher
    /// (the last sample taken), reaps the command for its exact peak, then
    /// reads what the process events, the kernel's log and the orphans
    /// still hold.
    fn end(self, args: &RunArgs) -> Result<Ended, Stop> {
        let pid = self.pid;
        let waited = child::wait_terminated(pid);
        let duration_s = self.t0.elapsed().as_secs_f64();
        let recording = self.sampling.map(SamplingThread::finish);
        let phases = self.phases.map(Receiver::finish);
        drop(self.exporter);
        if let Some(l) = self.live {
            l.stop();
        }
        let signals = self.forwarder.map(|f| f.disarm()).unwrap_or_default();
        waited.map_err(|e| Stop::new(exit::FAILURE, format!("waiting for the command: {e}")))?;
        let exit_info = child::reap(pid)
            .map_err(|e| Stop::new(exit::FAILURE, format!("reaping the command: {e}")))?;
        // The command's exit and any kill were logged before it could be
        // reaped: read what is left.
        let lives = self.events.map(ProcessEvents::finish);
        let mut kernel_log = take_kernel_log(self.kernel_log);
        kernel_log.poll();
        let end_ns = (duration_s * 1e9) as u64;
        let late_orphans = orphans::reap(pid, &self.inherited);
        let mut recording = recording
            .map_err(|e| Stop::new(exit::FAILURE, format!("could not start sampling: {e}")))?;
        for o in late_orphans {
            recording.orphans.push(recording::OrphanEnd {
                pid: o.pid,
                name: o.name,
                ended_ns: end_ns,
                wait_status: o.wait_status,
            });
        }
        match phases {
            Ok(log) => recording.phases = Some(log),
            Err(why) => {
                recording.unavailable.insert("phases".into(), why);
            }
        }
        let (torch_attribution, warnings) = self
            .attribution
            .as_ref()
            .map(torch_attribution::AttributionDir::read)
            .unwrap_or_default();
        for w in warnings {
            crate::say::say!("memprobe: warning: attribution record {w} (skipped)");
        }
        drop(self.attribution);
        let facts = RunFacts {
            command: args
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            pid,
            interval: args.interval,
            started_at_unix_s: self.started_at_unix_s,
            duration_s,
            exit: exit_info,
            signals,
            memprobe_cpu_s: child::own_cpu_s(),
            torch_attribution,
        };
        Ok(Ended {
            recording,
            facts,
            lives,
            kernel_log,
            t0_monotonic_ns: self.t0_monotonic_ns,
        })
    }
}

/// The kernel's log, back from the sampling thread (which has ended; a
/// share still held elsewhere is left a closed log).
fn take_kernel_log(shared: Arc<Mutex<KernelLog>>) -> KernelLog {
    match Arc::try_unwrap(shared) {
        Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
        Err(shared) => {
            let mut l = shared.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *l, KernelLog::closed())
        }
    }
}

/// Folds the command's exact peak into the recording, judges any OOM kill,
/// and builds the report.
fn judge(ended: Ended) -> RunReport {
    let Ended {
        mut recording,
        facts,
        lives,
        kernel_log,
        t0_monotonic_ns,
    } = ended;
    // Whether the command had children, whose peaks the kernel folds into
    // its ru_maxrss: every birth is known with the process events.
    let children = lives
        .as_ref()
        .ok()
        .filter(|l| l.complete())
        .map(|l| l.members.values().any(|m| m.pid != facts.pid));
    report::add_rusage(&mut recording, &facts, children);
    // The phase open when a process was killed, from what its trackers sent
    // (the log counts nanoseconds from the spawn).
    let log = recording.phases.take();
    oom_kill::explain_run(
        &mut recording,
        &facts,
        t0_monotonic_ns,
        lives.as_ref().map_err(String::clone),
        &kernel_log,
        &|pid, t| {
            log.as_ref()?
                .phase_at(pid, t.saturating_sub(t0_monotonic_ns))
        },
    );
    recording.phases = log;
    report::build(&recording, &facts)
}

impl Outputs {
    /// Writes each output reserved, saying where; false when one failed.
    fn write(self, rep: &RunReport) -> bool {
        let mut written = true;
        let mut write = |file: Option<AtomicFile>, render: &dyn Fn() -> Result<Vec<u8>, String>| {
            let Some(file) = file else { return };
            let target = file.path().display().to_string();
            let done = render().and_then(|bytes| {
                file.write(&bytes)
                    .and_then(|()| file.finish())
                    .map_err(|e| e.message().to_string())
            });
            match done {
                Ok(()) => crate::say::say!("memprobe: wrote {target}"),
                Err(e) => {
                    crate::say::say!("memprobe: {target}: {e}");
                    written = false;
                }
            }
        };
        write(self.json, &|| {
            let mut v = serde_json::to_vec(rep).map_err(|e| e.to_string())?;
            v.push(b'\n');
            Ok(v)
        });
        write(self.csv, &|| Ok(timeline_csv::render(rep).into_bytes()));
        write(self.plot, &|| plot::render(rep).map(String::into_bytes));
        write(self.html, &|| html::render(rep).map(String::into_bytes));
        written
    }
}
