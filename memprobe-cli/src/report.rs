//! The result of `run`: the JSON document (schema in
//! `docs/run-output.schema.json`, fields in `docs/cli.md`) and the summary
//! printed on stderr. Bytes are integers; times are seconds as f64.

use crate::child::ExitInfo;
use crate::recording::{PeakSource, ProcessRecord, Recording};
use crate::signals::{self, SignalEvent};
use crate::units;
use memprobe_core::cgroup::CgroupVersion;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// The version of the JSON layout; bumped on any incompatible change.
pub(crate) const SCHEMA_VERSION: u32 = 1;

fn s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Facts about the run that the recording does not hold.
pub(crate) struct RunFacts {
    pub(crate) command: Vec<String>,
    pub(crate) pid: u32,
    pub(crate) interval: Duration,
    pub(crate) started_at_unix_s: f64,
    pub(crate) duration_s: f64,
    pub(crate) exit: ExitInfo,
    pub(crate) signals: Vec<SignalEvent>,
    pub(crate) memprobe_cpu_s: f64,
}

/// The JSON document of `run`.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) schema_version: u32,
    pub(crate) kind: &'static str,
    pub(crate) memprobe_version: &'static str,
    pub(crate) command: Vec<String>,
    pub(crate) pid: u32,
    pub(crate) interval_s: f64,
    pub(crate) started_at_unix_s: f64,
    pub(crate) duration_s: f64,
    pub(crate) samples: u64,
    pub(crate) missed_ticks: u64,
    pub(crate) exit: ExitReport,
    pub(crate) tree: TreeReport,
    pub(crate) peak_process: Option<ProcessReport>,
    pub(crate) processes: Vec<ProcessReport>,
    pub(crate) processes_seen: u64,
    pub(crate) cgroup: Option<CgroupReport>,
    pub(crate) gpus: Vec<GpuReport>,
    pub(crate) unavailable: BTreeMap<String, String>,
    pub(crate) signals: Vec<SignalReport>,
    pub(crate) memprobe_cpu_s: f64,
    pub(crate) timeline_merged: u64,
    pub(crate) timeline: Vec<PointReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ExitReport {
    pub(crate) status: i32,
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
    pub(crate) signal_name: Option<String>,
    pub(crate) core_dumped: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct TreeReport {
    pub(crate) peak_rss_bytes: u64,
    pub(crate) peak_at_s: Option<f64>,
    pub(crate) peak_fidelity: &'static str,
    pub(crate) max_processes: u32,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProcessReport {
    pub(crate) pid: u32,
    pub(crate) ppid: Option<u32>,
    pub(crate) name: String,
    pub(crate) first_seen_s: f64,
    pub(crate) last_seen_s: f64,
    pub(crate) exited: bool,
    pub(crate) peak_rss_bytes: u64,
    pub(crate) peak_source: &'static str,
    pub(crate) vmhwm_bytes: Option<u64>,
    pub(crate) max_sampled_rss_bytes: u64,
    pub(crate) rusage_maxrss_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct CgroupReport {
    pub(crate) version: &'static str,
    pub(crate) path: String,
    pub(crate) limit_bytes: Option<u64>,
    pub(crate) start_bytes: Option<u64>,
    pub(crate) end_bytes: Option<u64>,
    pub(crate) peak_bytes: Option<u64>,
    pub(crate) peak_fidelity: &'static str,
    pub(crate) sampled_peak_bytes: Option<u64>,
    pub(crate) sampled_peak_at_s: Option<f64>,
    pub(crate) read_errors: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct GpuReport {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) uuid: String,
    pub(crate) total_bytes: u64,
    pub(crate) peak_used_bytes: Option<u64>,
    pub(crate) peak_at_s: Option<f64>,
    pub(crate) peak_fidelity: &'static str,
    pub(crate) tree_peak_used_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SignalReport {
    pub(crate) signal: i32,
    pub(crate) name: String,
    pub(crate) at_s: f64,
    pub(crate) forwarded: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct PointReport {
    pub(crate) t_s: f64,
    pub(crate) tree_rss_bytes: u64,
    pub(crate) processes: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cgroup_bytes: Option<u64>,
    pub(crate) gpu_used_bytes: Vec<Option<u64>>,
}

pub(crate) fn version_str(v: CgroupVersion) -> &'static str {
    match v {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    }
}

fn process_report(p: &ProcessRecord) -> ProcessReport {
    let (peak, source) = p.peak();
    ProcessReport {
        pid: p.pid,
        ppid: p.ppid,
        name: p.name.clone(),
        first_seen_s: s(p.first_seen_ns),
        last_seen_s: s(p.last_seen_ns),
        exited: p.exited,
        peak_rss_bytes: peak,
        peak_source: source.as_str(),
        vmhwm_bytes: p.vmhwm,
        max_sampled_rss_bytes: p.max_sampled_rss,
        rusage_maxrss_bytes: p.rusage_maxrss,
    }
}

/// Folds the child's `ru_maxrss` into its record (creating the record if the
/// child exited before the first sample saw it).
pub(crate) fn add_rusage(rec: &mut Recording, facts: &RunFacts) {
    let rusage = facts.exit.maxrss_bytes;
    if let Some(p) = rec.processes.iter_mut().find(|p| p.pid == facts.pid) {
        p.rusage_maxrss = Some(rusage);
        p.exited = true;
        return;
    }
    let name = facts
        .command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).chars().take(15).collect())
        .unwrap_or_default();
    let end = (facts.duration_s * 1e9) as u64;
    rec.processes.insert(
        0,
        ProcessRecord {
            pid: facts.pid,
            ppid: Some(std::process::id()),
            name,
            first_seen_ns: 0,
            last_seen_ns: end,
            exited: true,
            vmhwm: None,
            max_sampled_rss: 0,
            rusage_maxrss: Some(rusage),
        },
    );
    rec.processes_seen += 1;
}

/// Builds the JSON document.
pub(crate) fn build(rec: &Recording, facts: &RunFacts) -> RunReport {
    let cgroup = rec.cgroup.as_ref().map(|c| {
        let exact = c.exact_peak.is_some();
        CgroupReport {
            version: version_str(c.version),
            path: c.path.clone(),
            limit_bytes: c.limit,
            start_bytes: c.start,
            end_bytes: c.end,
            peak_bytes: c.exact_peak.or(c.sampled_peak.map(|(v, _)| v)),
            peak_fidelity: if exact { "exact" } else { "sampled" },
            sampled_peak_bytes: c.sampled_peak.map(|(v, _)| v),
            sampled_peak_at_s: c.sampled_peak.map(|(_, t)| s(t)),
            read_errors: c.errors,
        }
    });
    RunReport {
        schema_version: SCHEMA_VERSION,
        kind: "run",
        memprobe_version: env!("CARGO_PKG_VERSION"),
        command: facts.command.clone(),
        pid: facts.pid,
        interval_s: facts.interval.as_secs_f64(),
        started_at_unix_s: facts.started_at_unix_s,
        duration_s: facts.duration_s,
        samples: rec.samples,
        missed_ticks: rec.missed_ticks,
        exit: ExitReport {
            status: facts.exit.status(),
            code: facts.exit.code,
            signal: facts.exit.signal,
            signal_name: facts.exit.signal.map(signals::name),
            core_dumped: facts.exit.core_dumped,
        },
        tree: TreeReport {
            peak_rss_bytes: rec.tree_peak.map_or(0, |(v, _)| v),
            peak_at_s: rec.tree_peak.map(|(_, t)| s(t)),
            peak_fidelity: "sampled",
            max_processes: rec.max_processes,
        },
        peak_process: rec.peak_process().map(process_report),
        processes: rec.processes.iter().map(process_report).collect(),
        processes_seen: rec.processes_seen,
        cgroup,
        gpus: rec
            .gpus
            .iter()
            .map(|g| GpuReport {
                index: g.index,
                name: g.name.clone(),
                uuid: g.uuid.clone(),
                total_bytes: g.total,
                peak_used_bytes: g.peak.map(|(v, _)| v),
                peak_at_s: g.peak.map(|(_, t)| s(t)),
                peak_fidelity: "sampled",
                tree_peak_used_bytes: g.tree_peak,
            })
            .collect(),
        unavailable: rec.unavailable.clone(),
        signals: facts
            .signals
            .iter()
            .map(|e| SignalReport {
                signal: e.signal,
                name: signals::name(e.signal),
                at_s: s(e.at_ns),
                forwarded: e.forwarded,
            })
            .collect(),
        memprobe_cpu_s: facts.memprobe_cpu_s,
        timeline_merged: rec.timeline.merged(),
        timeline: rec
            .timeline
            .points()
            .map(|p| PointReport {
                t_s: s(p.t_ns),
                tree_rss_bytes: p.tree_rss,
                processes: p.processes,
                cgroup_bytes: p.cgroup,
                gpu_used_bytes: p.gpus.clone(),
            })
            .collect(),
    }
}

/// The command as one line, arguments with spaces quoted.
pub(crate) fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The end-of-run summary (several lines, each ending in a newline).
pub(crate) fn summary(r: &RunReport) -> String {
    let mut out = String::new();
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
    let _ = writeln!(
        out,
        "memprobe: {} {how} after {}",
        command_line(&r.command),
        units::secs(r.duration_s)
    );
    let row = |out: &mut String, label: &str, text: String| {
        let _ = writeln!(out, "  {label:<22}{text}");
    };
    row(
        &mut out,
        "peak tree RSS",
        format!(
            "{}{}  (sampled; {} process{} at most)",
            units::bytes(r.tree.peak_rss_bytes),
            r.tree
                .peak_at_s
                .map(|t| format!(" at {}", units::secs(t)))
                .unwrap_or_default(),
            r.tree.max_processes,
            if r.tree.max_processes == 1 { "" } else { "es" }
        ),
    );
    match &r.peak_process {
        Some(p) => {
            let how = match p.peak_source {
                s if s == PeakSource::Rusage.as_str() => {
                    "exact (wait4 ru_maxrss: this process or a child it waited for)"
                }
                _ => "exact (kernel VmHWM)",
            };
            row(
                &mut out,
                "peak single process",
                format!(
                    "{}  pid {} ({}), {how}",
                    units::bytes(p.peak_rss_bytes),
                    p.pid,
                    p.name
                ),
            );
        }
        None => row(&mut out, "peak single process", "-".into()),
    }
    match &r.cgroup {
        Some(c) => row(
            &mut out,
            &format!("container (cgroup {})", c.version),
            format!(
                "{} peak ({}), {} at start, limit {}",
                units::opt_bytes(c.peak_bytes),
                c.peak_fidelity,
                units::opt_bytes(c.start_bytes),
                c.limit_bytes.map_or_else(|| "none".into(), units::bytes),
            ),
        ),
        None => row(
            &mut out,
            "container (cgroup)",
            format!(
                "unavailable: {}",
                r.unavailable.get("cgroup").map_or("", String::as_str)
            ),
        ),
    }
    if r.gpus.is_empty() {
        row(
            &mut out,
            "GPUs",
            match r.unavailable.get("gpus") {
                Some(why) => format!("unavailable: {why}"),
                None => "none".into(),
            },
        );
    }
    for g in &r.gpus {
        row(
            &mut out,
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
    for sig in &r.signals {
        row(
            &mut out,
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
    row(
        &mut out,
        "samples",
        format!(
            "{} every {}{}",
            r.samples,
            units::duration(Duration::from_secs_f64(r.interval_s)),
            if r.missed_ticks > 0 {
                format!(
                    " ({} ticks missed: the sampler fell behind)",
                    r.missed_ticks
                )
            } else {
                String::new()
            }
        ),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        let argv = vec![
            "python".to_string(),
            "-c".into(),
            "print('hi there')".into(),
        ];
        assert_eq!(command_line(&argv), r"python -c 'print('\''hi there'\'')'");
    }
}
