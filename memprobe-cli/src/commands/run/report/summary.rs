//! The end-of-run summary on stderr: a headline (the command, how it ended,
//! after how long), the OOM verdict's paragraph when there is one, then one
//! row per figure: the tree, the largest process, the container, the GPUs,
//! the signals, the phases, the samples.

use super::{command_line, RunReport};
use crate::commands::run::gpu_exact::{ExactDeviceReport, GpuExactReport};
use crate::commands::run::ranks;
use crate::commands::run::recording::PeakSource;
use crate::commands::run::tree_origins::Found;
use crate::commands::run::tree_pss;
use crate::unavailable;
use crate::units;
use std::fmt::Write as _;
use std::time::Duration;

/// The summary as it is written: lines of its own, and rows of a label and
/// its figures.
struct Rows(String);

impl Rows {
    fn line(&mut self, text: &str) {
        let _ = writeln!(self.0, "memprobe: {text}");
    }

    fn row(&mut self, label: &str, text: String) {
        let _ = writeln!(self.0, "  {label:<22}{text}");
    }
}

/// The end-of-run summary (several lines, each ending in a newline); with
/// `verbose`, the whole reason of every source not measured.
pub(crate) fn summary(r: &RunReport, verbose: bool) -> String {
    let why = |name: &str| {
        unavailable::shown(r.unavailable.get(name).map_or("", String::as_str), verbose)
    };
    let mut out = Rows(String::new());
    out.line(&headline(r));
    if let Some(text) = r.oom_kill.as_ref().and_then(|o| o.explanation.as_deref()) {
        out.line(text);
    }
    tree(&mut out, r);
    peak_process(&mut out, r);
    container(&mut out, r, &why("cgroup"));
    gpus(&mut out, r, &why("gpus"));
    if let Some(x) = &r.gpu_exact {
        gpu_exact(&mut out, x);
    }
    signals(&mut out, r);
    out.0.push_str(&super::phases::summary(r));
    torch_attribution(&mut out, r);
    samples(&mut out, r);
    out.0
}

/// The command, how it ended, and after how long.
fn headline(r: &RunReport) -> String {
    let how = match (r.exit.code, &r.exit.signal_name) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(n)) => format!(
            "was killed by {n}{} (status {})",
            if r.exit.core_dumped {
                ", core dumped"
            } else {
                ""
            },
            r.exit.status
        ),
        _ => "ended".to_string(),
    };
    format!(
        "{} {how} after {}",
        command_line(&r.command, 100),
        units::secs(r.duration_s)
    )
}

/// The tree's peak RSS (and, with `--pss`, its PSS and USS).
fn tree(out: &mut Rows, r: &RunReport) {
    let most = format!(
        "{} process{} at most",
        r.tree.max_processes,
        if r.tree.max_processes == 1 { "" } else { "es" }
    );
    out.row(
        "peak tree RSS",
        if r.tree.raised_to_a_process() {
            format!(
                "{}  (at least one of its processes' exact peak; samples saw {}, {most})",
                units::bytes(r.tree.peak_rss_bytes),
                units::bytes(r.tree.sampled_peak_bytes),
            )
        } else {
            format!(
                "{}{}  (sampled; {most})",
                units::bytes(r.tree.peak_rss_bytes),
                r.tree
                    .peak_at_s
                    .map(|t| format!(" at {}", units::secs(t)))
                    .unwrap_or_default(),
            )
        },
    );
    let kinds = r.tree.host_kinds_at_peak.as_ref();
    if let Some(k) = kinds.and_then(crate::commands::run::host_kinds::summary) {
        out.row("RAM by kind", k);
    }
    if let Some(pss) = &r.pss {
        for (label, text) in tree_pss::summary_rows(pss, r.tree.sampled_peak_bytes) {
            out.row(label, text);
        }
    }
}

/// The process with the largest exact peak, and where that peak comes from.
fn peak_process(out: &mut Rows, r: &RunReport) {
    let Some(p) = &r.peak_process else {
        out.row("peak single process", "-".into());
        return;
    };
    let how = match p.peak_source {
        s if s == PeakSource::Rusage.as_str() && p.rusage_includes_children == Some(false) => {
            "exact (wait4 ru_maxrss; it started no process)"
        }
        s if s == PeakSource::Rusage.as_str() => {
            "exact (wait4 ru_maxrss: this process or a child it waited for)"
        }
        s if s == PeakSource::ExitHwm.as_str() => {
            "exact (the kernel's high-water mark at its exit)"
        }
        _ => "exact (kernel VmHWM)",
    };
    out.row(
        "peak single process",
        format!(
            "{}  pid {} ({}{}), {how}",
            units::bytes(p.peak_rss_bytes),
            p.pid,
            p.name,
            ranks::after_pid(p.ranks)
        ),
    );
}

/// The container's peak, usage at start and limit, or why it is unknown.
fn container(out: &mut Rows, r: &RunReport, why: &str) {
    match &r.cgroup {
        Some(c) => out.row(
            &format!("container (cgroup {})", c.version),
            format!(
                "{} peak ({}), {} at start, limit {}",
                units::opt_bytes(c.peak_bytes),
                c.peak_fidelity,
                units::opt_bytes(c.start_bytes),
                c.limit_bytes.map_or_else(|| "none".into(), units::bytes),
            ),
        ),
        None => out.row("container (cgroup)", format!("unavailable: {why}")),
    }
}

/// Each GPU's sampled peak and the run's share of it, or why there is none.
fn gpus(out: &mut Rows, r: &RunReport, why: &str) {
    if r.gpus.is_empty() {
        out.row(
            "GPUs",
            if r.unavailable.contains_key("gpus") {
                format!("unavailable: {why}")
            } else {
                "none".into()
            },
        );
    }
    for g in &r.gpus {
        out.row(
            &format!("GPU {}", g.index),
            format!(
                "{} peak of {} (sampled), this run's processes {} ({})",
                units::opt_bytes(g.peak_used_bytes),
                units::bytes(g.total_bytes),
                units::opt_bytes(g.tree_peak_used_bytes),
                g.name
            ),
        );
    }
}

/// `--gpu-exact`: each device's exact tree peak, the processes' own, the
/// out-of-memory failures and the allocations not counted.
fn gpu_exact(out: &mut Rows, x: &GpuExactReport) {
    gpu_exact_devices(out, x);
    gpu_exact_processes(out, x);
    gpu_out_of_memory(out, x);
    let not_counted: u64 = x.processes.iter().map(|p| p.not_counted_calls).sum();
    if not_counted > 0 {
        out.row(
            "GPU not counted",
            format!("{not_counted} allocation(s) passed through uncounted (see docs/gpu.md)"),
        );
    }
}

/// Each device's exact peak over the whole tree, and its largest process.
fn gpu_exact_devices(out: &mut Rows, x: &GpuExactReport) {
    if x.devices.is_empty() {
        out.row(
            "GPU exact",
            "no device memory allocated through the driver (interposer loaded)".into(),
        );
    }
    for d in &x.devices {
        gpu_exact_device(out, d);
    }
}

/// One device's exact tree peak, and what held it by origin.
fn gpu_exact_device(out: &mut Rows, d: &ExactDeviceReport) {
    out.row(
        &format!("GPU {} exact peak", d.index),
        format!(
            "{} tree (exact, all processes at once), {} at end; largest process {}",
            units::bytes(d.tree_peak_bytes),
            units::bytes(d.tree_end_bytes),
            d.max_process_pid.map_or_else(
                || "-".into(),
                |pid| format!("pid {pid} {}", units::bytes(d.max_process_peak_bytes))
            ),
        ),
    );
    let label = format!("  at GPU {}'s peak", d.index);
    match (&d.origins_at_tree_peak, d.origins_at_tree_peak_unknown) {
        (Some(o), _) => out.row(
            &label,
            crate::commands::run::gpu_origins::summary_in(
                &o.origins,
                d.context_bytes,
                o.phase.as_deref(),
            ),
        ),
        (None, Some(why)) => out.row(&label, format!("by origin unknown: {why}")),
        (None, None) => {}
    }
}

/// The processes' own exact peaks (eight at most), with the context NVML
/// adds, and what held each peak by origin.
fn gpu_exact_processes(out: &mut Rows, x: &GpuExactReport) {
    for p in x
        .processes
        .iter()
        .filter(|p| p.peak_bytes.iter().any(|&b| b > 0))
        .take(8)
    {
        let per: Vec<String> = p
            .peak_bytes
            .iter()
            .enumerate()
            .filter(|(_, &b)| b > 0)
            .map(|(d, &b)| format!("GPU {d} {}", units::bytes(b)))
            .collect();
        let context: Vec<String> = p
            .context_bytes
            .iter()
            .enumerate()
            .filter_map(|(d, c)| Some(format!("GPU {d} {}", units::bytes((*c)?))))
            .collect();
        out.row(
            &format!("  pid {}", p.pid),
            format!(
                "{} peak (exact){}{}",
                per.join(", "),
                if p.exited { ", ended" } else { "" },
                if context.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; context {} (NVML minus counted, sampled)",
                        context.join(", ")
                    )
                }
            ),
        );
        for (d, o) in p.origins_at_peak.iter().enumerate() {
            // The tree's line already says it when this process held it all.
            let shown = x
                .devices
                .get(d)
                .and_then(|t| t.origins_at_tree_peak.as_ref())
                .is_some_and(|t| t.found == Found::OneProcess && t.pid == Some(p.pid));
            if let Some(o) = o.as_ref().filter(|o| o.peak_bytes > 0 && !shown) {
                let context = p.context_bytes.get(d).copied().flatten();
                out.row(
                    &format!("    at GPU {d}'s peak"),
                    crate::commands::run::gpu_origins::summary(o, context),
                );
            }
        }
        for (d, s) in p.stacks_at_peak.iter().enumerate() {
            let Some(s) = s.as_ref().filter(|s| s.peak > 0) else {
                continue;
            };
            let lines = crate::commands::run::gpu_stacks::lines(s);
            for (i, line) in lines.into_iter().enumerate() {
                let label = if i == 0 {
                    format!("    paths at GPU {d}")
                } else {
                    String::new()
                };
                out.row(&label, line);
            }
        }
    }
}

/// CUDA out-of-memory failures the interposer counted, the last of each
/// process.
fn gpu_out_of_memory(out: &mut Rows, x: &GpuExactReport) {
    // A GPU out-of-memory the program may have caught and survived
    // (PyTorch raises, a training loop retries with a smaller batch):
    // said whenever the interposer counted one.
    if x.oom_failures > 0 {
        let last = x
            .processes
            .iter()
            .filter(|p| p.oom_failures > 0)
            .map(|p| {
                let what = p.last_oom.as_ref().map_or_else(String::new, |o| {
                    format!(
                        ": last {} on {}{}",
                        units::bytes(o.size_bytes),
                        o.device
                            .map_or_else(|| "host pinned memory".into(), |d| format!("GPU {d}")),
                        o.api.map(|a| format!(" ({a})")).unwrap_or_default()
                    ) + &o.held_by_origin.as_ref().map_or_else(String::new, |h| {
                        format!(", held then {}", crate::commands::run::gpu_origins::held(h))
                    })
                });
                format!("pid {} {}x{what}", p.pid, p.oom_failures)
            })
            .take(4)
            .collect::<Vec<_>>()
            .join("; ");
        out.row(
            "GPU out of memory",
            format!(
                "{} allocation(s) failed with CUDA out-of-memory ({last})",
                x.oom_failures
            ),
        );
    }
}

/// Lines shown of the PyTorch attribution records (the JSON has them all).
const TORCH_LINES: usize = 24;

/// One line per PyTorch attribution record: each epoch's peak step and
/// each PyTorch out-of-memory error, with the top three blocks.
fn torch_attribution(out: &mut Rows, r: &RunReport) {
    use crate::commands::run::torch_attribution as ta;
    let ranks = r.torch_attribution.iter().any(|t| t.rank > 0);
    for t in r.torch_attribution.iter().take(TORCH_LINES) {
        out.row(&ta::label(t, ranks), ta::summary(t));
    }
    let more = r.torch_attribution.len().saturating_sub(TORCH_LINES);
    if more > 0 {
        out.row(
            "torch",
            format!("{more} more attribution record(s) in the JSON"),
        );
    }
}

/// Each signal memprobe saw, and whether it was forwarded.
fn signals(out: &mut Rows, r: &RunReport) {
    for sig in &r.signals {
        out.row(
            "signal",
            format!(
                "{} at {}, {}",
                sig.name,
                units::secs(sig.at_s),
                if sig.forwarded {
                    "forwarded to the child"
                } else {
                    "from the terminal (the child got it directly)"
                }
            ),
        );
    }
}

/// How many samples, how often, the ticks missed, and what sampling cost.
fn samples(out: &mut Rows, r: &RunReport) {
    let widened = r
        .cpu_cap
        .as_ref()
        .filter(|c| c.widenings > 0)
        .map(|c| {
            format!(
                ", widened up to {} to stay under --max-cpu {}%",
                units::duration(Duration::from_secs_f64(c.widest_interval_s)),
                c.max_cpu_percent
            )
        })
        .unwrap_or_default();
    out.row(
        "samples",
        format!(
            "{} every {}{widened}{}",
            r.samples,
            units::duration(Duration::from_secs_f64(r.interval_s)),
            if r.missed_ticks > 0 {
                format!(
                    " ({} tick{} missed: the sampler fell behind)",
                    r.missed_ticks,
                    if r.missed_ticks == 1 { "" } else { "s" }
                )
            } else {
                String::new()
            }
        ),
    );
    let share = if r.duration_s > 0.0 {
        r.memprobe_cpu_s / r.duration_s * 100.0
    } else {
        0.0
    };
    out.row(
        "memprobe CPU",
        format!(
            "{share:.2} % of one core ({:.3} s){}",
            r.memprobe_cpu_s,
            r.cpu_cap
                .as_ref()
                .map(|c| format!(", capped at {}%", c.max_cpu_percent))
                .unwrap_or_default()
        ),
    );
}
