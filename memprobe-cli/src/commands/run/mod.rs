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
mod gpu_exact;
mod kernel_log;
mod live;
mod oom_kill;
mod orphans;
mod phase_channel;
mod phase_log;
mod phase_report;
mod plot;
mod process_events;
mod process_lines;
mod recording;
mod report;
mod sampling;
mod timeline;
mod timeline_csv;
mod tree_pss;

use crate::args::RunArgs;
use crate::exit;
use crate::gpu_readings;
use crate::signals::{self, Forwarder, SigSet};
use crate::terminal::is_tty;
use crate::units;
use gpu_exact::Injection;
use live::{LiveLine, LiveState};
use memprobe_core::cgroup::{CgroupOptions, CgroupSampler, CgroupVersion};
use memprobe_core::sinks::AtomicFile;
use phase_channel::{PhaseChannel, Receiver};
use report::RunFacts;
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
}

impl Outputs {
    fn reserve(args: &RunArgs) -> Result<Outputs, String> {
        let named = [
            ("--json", &args.json),
            ("--csv", &args.csv),
            ("--plot", &args.plot),
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
    let loc = memprobe_core::cgroup::discover().map_err(|e| e.message().to_string())?;
    let reset_peak = loc.version == CgroupVersion::V2;
    CgroupSampler::at(loc, CgroupOptions { reset_peak }).map_err(|e| e.to_string())
}

pub(crate) fn main(args: RunArgs) -> i32 {
    let outputs = match Outputs::reserve(&args) {
        Ok(o) => o,
        Err(msg) => {
            crate::say::say!("memprobe: {msg}");
            return exit::USAGE;
        }
    };
    let injection = if args.gpu_exact {
        match Injection::prepare() {
            Ok(i) => Some(i),
            Err(msg) => {
                crate::say::say!("memprobe: {msg}");
                return exit::USAGE;
            }
        }
    } else {
        None
    };
    let exact = match injection.as_ref().map(Injection::watcher).transpose() {
        Ok(w) => w,
        Err(msg) => {
            crate::say::say!("memprobe: {msg}");
            return exit::FAILURE;
        }
    };
    let set = SigSet::of(&signals::FORWARDED);
    if let Err(e) = set.block() {
        crate::say::say!("memprobe: cannot block signals: {e}");
        return exit::FAILURE;
    }
    let cgroup = open_cgroup();
    let gpus = gpu_readings::read_gpus();
    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();

    let started_at_unix_s = units::unix_now_s();
    let mut env = injection.as_ref().map(Injection::env).unwrap_or_default();
    // The command's trackers send their phases here (phase_channel.rs).
    let phases = PhaseChannel::bind();
    if let Ok(p) = &phases {
        env.push(p.env());
    }
    // From before the spawn (a command that fills the container at once
    // must not find memprobe unshielded); the command gets its value back.
    let oom_score_adj = oom_kill::shield_self();
    // Every birth and death of the tree, and the kernel's record of its OOM
    // kills, from before the spawn: the command's first fork counts.
    let events = process_events::ProcessEvents::start();
    let kernel_log = Arc::new(Mutex::new(kernel_log::KernelLog::open()));
    let inherited = orphans::inherited();
    orphans::become_subreaper();
    let pid = match child::spawn(&args.command, &env, oom_score_adj) {
        Ok(pid) => pid,
        Err(e) => {
            crate::say::say!("memprobe: {}", e.message);
            return e.status;
        }
    };
    let t0 = Instant::now();
    let t0_monotonic_ns = memprobe_core::monotonic_ns();
    // The same clock as Instant's (CLOCK_MONOTONIC), read at once: phase
    // times from the command map onto the timeline through it.
    let phases = phases.and_then(|p| p.start(t0_monotonic_ns));
    let forwarder = match Forwarder::start(set, pid as libc::pid_t, t0) {
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
        t0,
        cgroup,
        gpus,
        live: live_state.clone(),
        exact,
        pss: args.pss,
        kernel_log: Some(Arc::clone(&kernel_log)),
        inherited: inherited.clone(),
    });
    let live = live_state.and_then(|s| LiveLine::start(s, t0));
    let exporter = args.serve.and_then(|addr| {
        crate::commands::serve::start_for_tree(addr, pid)
            .map_err(|e| crate::say::say!("memprobe: warning: --serve: {e}"))
            .ok()
    });

    let waited = child::wait_terminated(pid);
    let duration_s = t0.elapsed().as_secs_f64();
    let recording = sampling.map(SamplingThread::finish);
    let phases = phases.map(Receiver::finish);
    drop(exporter);
    if let Some(l) = live {
        l.stop();
    }
    let signals = forwarder.map(|f| f.disarm()).unwrap_or_default();
    if let Err(e) = waited {
        crate::say::say!("memprobe: waiting for the command: {e}");
        return exit::FAILURE;
    }
    let exit_info = match child::reap(pid) {
        Ok(x) => x,
        Err(e) => {
            crate::say::say!("memprobe: reaping the command: {e}");
            return exit::FAILURE;
        }
    };
    // The command's exit and any kill were logged before it could be
    // reaped: read what is left.
    let lives = events.map(process_events::ProcessEvents::finish);
    let mut kernel_log = match Arc::try_unwrap(kernel_log) {
        Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
        Err(shared) => {
            let mut l = shared.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *l, kernel_log::KernelLog::closed())
        }
    };
    kernel_log.poll();
    let end_ns = (duration_s * 1e9) as u64;
    let late_orphans = orphans::reap(pid, &inherited);
    let mut recording = match recording {
        Ok(r) => r,
        Err(e) => {
            crate::say::say!("memprobe: could not start sampling: {e}");
            return exit::FAILURE;
        }
    };
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
    let facts = RunFacts {
        command,
        pid,
        interval: args.interval,
        started_at_unix_s,
        duration_s,
        exit: exit_info,
        signals,
        memprobe_cpu_s: child::own_cpu_s(),
    };
    // Whether the command had children, whose peaks the kernel folds into
    // its ru_maxrss: every birth is known with the process events.
    let children = lives
        .as_ref()
        .ok()
        .filter(|l| l.complete())
        .map(|l| l.members.values().any(|m| m.pid != pid));
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
    let rep = report::build(&recording, &facts);
    crate::say::text(&report::summary(&rep, args.verbose));

    let mut failed = false;
    let mut write = |file: Option<AtomicFile>, render: &dyn Fn() -> Result<Vec<u8>, String>| {
        let Some(file) = file else { return };
        let target = file.path().display().to_string();
        let written = render().and_then(|bytes| {
            file.write(&bytes)
                .and_then(|()| file.finish())
                .map_err(|e| e.message().to_string())
        });
        match written {
            Ok(()) => crate::say::say!("memprobe: wrote {target}"),
            Err(e) => {
                crate::say::say!("memprobe: {target}: {e}");
                failed = true;
            }
        }
    };
    write(outputs.json, &|| {
        let mut v = serde_json::to_vec(&rep).map_err(|e| e.to_string())?;
        v.push(b'\n');
        Ok(v)
    });
    write(outputs.csv, &|| Ok(timeline_csv::render(&rep).into_bytes()));
    write(outputs.plot, &|| plot::render(&rep).map(String::into_bytes));

    let status = rep.exit.status;
    if failed && status == 0 {
        exit::FAILURE
    } else {
        status
    }
}
