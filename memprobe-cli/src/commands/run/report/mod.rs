//! The result of `run`: the JSON document (schema in
//! `docs/run-output.schema.json`, fields in `docs/cli.md`), built from the
//! recording; the summary printed on stderr is in [`summary`].
//! Bytes are integers; times are seconds as f64.

use super::child::ExitInfo;
use super::gpu_exact::GpuExactReport;
use super::oom_kill::OomKillReport;
use super::phase_report::{self, PhaseChannelReport, PhaseReport};
use super::ranks::RankFields;
use super::recording::{ProcessRecord, Recording};
use super::torch_attribution::TorchRecord;
use super::tree_pss::PssReport;
use crate::commands::SCHEMA_VERSION;
use crate::signals::{self, SignalEvent};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

pub(super) mod phases;
mod summary;

pub(crate) use summary::summary;

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
    /// The PyTorch attribution records the command wrote.
    pub(crate) torch_attribution: Vec<TorchRecord>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gpu_exact: Option<GpuExactReport>,
    /// With `--pss` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pss: Option<PssReport>,
    /// Whether the kernel's OOM killer ended a process of the run.
    pub(crate) oom_kill: Option<OomKillReport>,
    pub(crate) unavailable: BTreeMap<String, String>,
    pub(crate) signals: Vec<SignalReport>,
    pub(crate) command_cpu_s: f64,
    pub(crate) memprobe_cpu_s: f64,
    /// The kernel's exit records: whether had, what they raised.
    pub(crate) exit_hwm: super::exit_stats::ExitHwmReport,
    /// The cost of the kinds' detail reads (absent with --no-host-kinds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host_kinds: Option<super::host_kinds::KindsCost>,
    /// With `--max-cpu` only: the cap and how far the interval widened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_cap: Option<crate::commands::run::cpu_cap::CpuCapReport>,
    pub(crate) timeline_merged: u64,
    pub(crate) timeline: Vec<PointReport>,
    /// The command's phases (phase_report.rs).
    pub(crate) phases: Vec<PhaseReport>,
    pub(crate) phase_channel: PhaseChannelReport,
    /// Each of the largest processes over time (the chart's lines).
    pub(crate) process_lines: crate::commands::run::process_lines::LinesReport,
    /// PyTorch's live blocks at each epoch's peak step and at each PyTorch
    /// out-of-memory error, as the command's integrations recorded them
    /// (torch_attribution.rs).
    pub(crate) torch_attribution: Vec<TorchRecord>,
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
    /// The largest sum sampled, raised to the largest exact single-process
    /// peak when that is larger: a tree never holds less than one of its
    /// processes did.
    pub(crate) peak_rss_bytes: u64,
    pub(crate) peak_at_s: Option<f64>,
    pub(crate) peak_fidelity: &'static str,
    pub(crate) max_processes: u32,
    /// The largest sum sampled (the JSON's `peak_rss_bytes` unless a
    /// process's exact peak raised it).
    #[serde(skip)]
    pub(crate) sampled_peak_bytes: u64,
    /// Its memory by kind at its largest sample (host_kinds.rs).
    pub(crate) host_kinds_at_peak: Option<super::host_kinds::KindsReport>,
}

impl TreeReport {
    /// The tree's peak from the samples and the largest exact
    /// single-process peak.
    fn new(sampled: Option<(u64, u64)>, exact: Option<u64>, max_processes: u32) -> TreeReport {
        let sampled_bytes = sampled.map_or(0, |(v, _)| v);
        let (peak_rss_bytes, peak_at_s) = match exact {
            // No sample caught a moment as high as this process alone: the
            // tree's peak is at least its peak, at a time nobody saw.
            Some(e) if e > sampled_bytes => (e, None),
            _ => (sampled_bytes, sampled.map(|(_, t)| s(t))),
        };
        TreeReport {
            peak_rss_bytes,
            peak_at_s,
            peak_fidelity: "sampled",
            max_processes,
            sampled_peak_bytes: sampled_bytes,
            host_kinds_at_peak: None,
        }
    }

    /// Whether a process's exact peak, not a sample, gives the peak.
    pub(crate) fn raised_to_a_process(&self) -> bool {
        self.peak_rss_bytes > self.sampled_peak_bytes
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProcessReport {
    pub(crate) pid: u32,
    pub(crate) ppid: Option<u32>,
    /// Its ranks in a job of several, when it sent them over the run
    /// channel (absent otherwise).
    #[serde(flatten)]
    pub(crate) ranks: Option<RankFields>,
    pub(crate) name: String,
    pub(crate) first_seen_s: f64,
    pub(crate) last_seen_s: f64,
    pub(crate) exited: bool,
    pub(crate) peak_rss_bytes: u64,
    pub(crate) peak_source: &'static str,
    pub(crate) vmhwm_bytes: Option<u64>,
    pub(crate) max_sampled_rss_bytes: u64,
    pub(crate) rusage_maxrss_bytes: Option<u64>,
    /// Whether `rusage_maxrss_bytes` may be a child's peak (see
    /// [`ProcessRecord::rusage_children`]); null for other processes, or
    /// where unknown.
    pub(crate) rusage_includes_children: Option<bool>,
    /// Its high-water mark at exit from the kernel's exit record.
    pub(crate) exit_hwm_bytes: Option<u64>,
    /// Its memory by kind at its largest sample (host_kinds.rs).
    pub(crate) host_kinds_at_peak: Option<super::host_kinds::KindsReport>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gpu_exact_peak_bytes: Option<Vec<u64>>,
    /// With `--pss` only (null where that read failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tree_pss_bytes: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tree_uss_bytes: Option<Option<u64>>,
}

fn process_report(p: &ProcessRecord) -> ProcessReport {
    let (peak, source) = p.peak();
    ProcessReport {
        pid: p.pid,
        ppid: p.ppid,
        ranks: None,
        name: p.name.clone(),
        first_seen_s: s(p.first_seen_ns),
        last_seen_s: s(p.last_seen_ns),
        exited: p.exited,
        peak_rss_bytes: peak,
        peak_source: source.as_str(),
        vmhwm_bytes: p.vmhwm,
        max_sampled_rss_bytes: p.max_sampled_rss,
        rusage_maxrss_bytes: p.rusage_maxrss,
        rusage_includes_children: p.rusage_children,
        exit_hwm_bytes: p.exit_hwm,
        host_kinds_at_peak: p
            .kinds_at_peak
            .as_deref()
            .map(super::host_kinds::KindsReport::new),
    }
}

/// Folds the child's `ru_maxrss` into its record (creating the record if the
/// child exited before the first sample saw it). `children`: whether it had
/// children (whose peaks the kernel folds into its `ru_maxrss`): from the
/// kernel's process events where read, else `Some(true)` when a sample saw
/// one, else unknown.
pub(crate) fn add_rusage(rec: &mut Recording, facts: &RunFacts, children: Option<bool>) {
    let rusage = facts.exit.maxrss_bytes;
    let sampled_children = rec.processes.iter().any(|p| p.pid != facts.pid);
    let children = if sampled_children {
        Some(true)
    } else {
        children
    };
    if let Some(p) = rec.processes.iter_mut().find(|p| p.pid == facts.pid) {
        p.rusage_maxrss = Some(rusage);
        p.rusage_children = children;
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
            rusage_children: children,
            last_rss: 0,
            ended_ns: Some(end),
            wait_status: None,
            exit_hwm: None,
            kinds_at_peak: None,
        },
    );
    rec.processes_seen += 1;
}

/// Builds the JSON document.
pub(crate) fn build(rec: &Recording, facts: &RunFacts) -> RunReport {
    let cgroup = rec.cgroup.as_ref().map(|c| {
        let exact = c.exact_peak.is_some();
        CgroupReport {
            version: c.version.as_str(),
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
    let mut gpu_exact = rec.gpu_exact.as_ref().map(GpuExactReport::new);
    if let (Some(x), Some(log)) = (gpu_exact.as_mut(), rec.phases.as_ref()) {
        // The phase open when the tree held each device's peak.
        for o in x
            .devices
            .iter_mut()
            .filter_map(|d| d.origins_at_tree_peak.as_mut())
        {
            o.phase = o.at_s.and_then(|t| log.phase_at(o.pid, (t * 1e9) as u64));
        }
    }
    let exact_devices = gpu_exact.as_ref().map(|g| g.devices.len());
    let end_ns = (facts.duration_s * 1e9) as u64;
    let (phases, phase_channel) = phase_report::build(
        rec.phases.as_ref(),
        &rec.timeline,
        rec.gpus.len(),
        rec.gpu_exact.as_ref(),
        end_ns,
    );
    let process = |p: &ProcessRecord| ProcessReport {
        ranks: phase_channel.rank_of(p.pid),
        ..process_report(p)
    };
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
            host_kinds_at_peak: rec
                .tree_kinds
                .as_ref()
                .map(super::host_kinds::KindsReport::new),
            ..TreeReport::new(
                rec.tree_peak,
                // ru_maxrss is some process's exact peak even where it is not
                // the command's own: the tree held at least that.
                rec.peak_process()
                    .map(|p| p.peak().0)
                    .max(rec.processes.iter().filter_map(|p| p.rusage_maxrss).max()),
                rec.max_processes,
            )
        },
        peak_process: rec.peak_process().map(process),
        processes: rec.processes.iter().map(process).collect(),
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
        gpu_exact,
        pss: rec.pss.clone(),
        oom_kill: rec.oom_kill.clone(),
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
        command_cpu_s: facts.exit.cpu_s,
        memprobe_cpu_s: facts.memprobe_cpu_s,
        exit_hwm: rec.exit_hwm.clone(),
        host_kinds: rec.kinds_cost.clone(),
        cpu_cap: rec.cpu_cap.clone(),
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
                gpu_exact_peak_bytes: exact_devices.map(|n| {
                    let mut v = p.gpu_exact.clone();
                    v.resize(n, 0);
                    v
                }),
                tree_pss_bytes: rec.pss.is_some().then_some(p.tree_pss),
                tree_uss_bytes: rec.pss.is_some().then_some(p.tree_uss),
            })
            .collect(),
        phases,
        phase_channel,
        process_lines: crate::commands::run::process_lines::report(
            &rec.lines,
            |pid| {
                rec.processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .map(|p| p.name.clone())
            },
            rec.processes_seen,
        ),
        torch_attribution: facts.torch_attribution.clone(),
    }
}

/// The command as one line, arguments with spaces quoted, control
/// characters escaped (`\n`), cut to about `max` characters.
pub(crate) fn command_line(argv: &[String], max: usize) -> String {
    let line = argv
        .iter()
        .map(|a| {
            let a: String = a
                .chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect();
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    if line.chars().count() > max {
        line.chars().take(max.saturating_sub(3)).collect::<String>() + "..."
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::run::recording::{CgroupRecord, GpuSeries};
    use crate::commands::run::timeline::Point;
    use memprobe_core::CgroupVersion;

    /// A recording with everything a run can hold: two GPUs, a cgroup with
    /// an exact peak, workers, a forwarded signal. Every output must handle
    /// it (today's builds have no GPUs, so only this test covers them).
    fn full() -> (Recording, RunFacts) {
        let mut rec = Recording::default();
        for i in 0..5u64 {
            rec.timeline.push(Point {
                t_ns: i * 10_000_000,
                tree_rss: (100 + i) << 20,
                processes: 2,
                cgroup: if i == 3 { None } else { Some((300 + i) << 20) },
                gpus: vec![
                    Some((1 + i) << 30),
                    if i == 2 { None } else { Some(5 << 30) },
                ],
                gpu_exact: if i == 1 {
                    vec![3 << 20, 7 << 20]
                } else {
                    vec![1 << 20]
                },
                tree_pss: None,
                tree_uss: None,
            });
        }
        rec.samples = 5;
        rec.tree_peak = Some((104 << 20, 40_000_000));
        rec.max_processes = 2;
        rec.processes = vec![
            ProcessRecord {
                pid: 100,
                ppid: Some(1),
                name: "train".into(),
                first_seen_ns: 0,
                last_seen_ns: 40_000_000,
                exited: true,
                vmhwm: Some(90 << 20),
                max_sampled_rss: 80 << 20,
                rusage_maxrss: None,
                rusage_children: None,
                last_rss: 80 << 20,
                ended_ns: Some(40_000_000),
                wait_status: None,
                exit_hwm: None,
                kinds_at_peak: None,
            },
            ProcessRecord {
                pid: 101,
                ppid: Some(100),
                name: "worker".into(),
                first_seen_ns: 10_000_000,
                last_seen_ns: 30_000_000,
                exited: true,
                vmhwm: Some(20 << 20),
                max_sampled_rss: 20 << 20,
                rusage_maxrss: None,
                rusage_children: None,
                last_rss: 20 << 20,
                ended_ns: Some(40_000_000),
                wait_status: None,
                exit_hwm: None,
                kinds_at_peak: None,
            },
        ];
        rec.processes_seen = 2;
        rec.cgroup = Some(CgroupRecord {
            version: CgroupVersion::V2,
            path: "/sys/fs/cgroup/job".into(),
            limit: Some(8 << 30),
            start: Some(300 << 20),
            end: Some(304 << 20),
            sampled_peak: Some((304 << 20, 40_000_000)),
            exact_peak: Some(400 << 20),
            errors: 1,
        });
        rec.gpus = (0..2)
            .map(|i| GpuSeries {
                index: i,
                name: "Test GPU".into(),
                uuid: format!("GPU-{i}"),
                total: 80 << 30,
                peak: Some((5 << 30, 40_000_000)),
                tree_peak: Some(4 << 30),
            })
            .collect();
        let facts = RunFacts {
            command: vec!["train".into(), "--epochs".into(), "2".into()],
            pid: 100,
            interval: Duration::from_millis(10),
            started_at_unix_s: 1.7e9,
            duration_s: 0.05,
            exit: ExitInfo {
                code: None,
                signal: Some(15),
                core_dumped: false,
                maxrss_bytes: 120 << 20,
                cpu_s: 0.04,
            },
            signals: vec![SignalEvent {
                signal: 15,
                at_ns: 20_000_000,
                forwarded: true,
            }],
            memprobe_cpu_s: 0.01,
            torch_attribution: Vec::new(),
        };
        add_rusage(&mut rec, &facts, None);
        (rec, facts)
    }

    #[test]
    fn every_output_handles_gpus_and_the_schema_agrees() {
        let (rec, facts) = full();
        let r = build(&rec, &facts);
        assert_eq!(r.exit.status, 143);
        let p = r.peak_process.as_ref().unwrap();
        // The command had a worker: its ru_maxrss (120 MiB) may be the
        // worker's, so its own peak is its VmHWM; the tree holds at least
        // the 120 MiB all the same.
        assert_eq!(
            (p.pid, p.peak_rss_bytes, p.peak_source),
            (100, 90 << 20, "vmhwm")
        );
        assert!(r.tree.peak_rss_bytes >= 120 << 20);
        assert_eq!(r.cgroup.as_ref().unwrap().peak_fidelity, "exact");

        let json = serde_json::to_value(&r).unwrap();
        let errors = crate::schema_check::check(
            &crate::schema_check::load("docs/run-output.schema.json"),
            &json,
        );
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(
            json["timeline"][2]["gpu_used_bytes"][1],
            serde_json::Value::Null
        );
        assert!(json["timeline"][3].get("cgroup_bytes").is_none());

        let csv = crate::commands::run::timeline_csv::render(&r);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("t_s,tree_rss_bytes,processes,cgroup_bytes,gpu0_used_bytes,gpu1_used_bytes")
        );
        assert_eq!(
            lines.nth(2),
            Some("0.020000,106954752,2,316669952,3221225472,")
        );

        let svg = crate::commands::run::plot::render(&r).unwrap();
        for needle in [
            "GPU 0 used (Test GPU",
            "GPU 1 used",
            "container (cgroup v2, limit 8.00 GiB)",
            "memory (GiB)",
        ] {
            assert!(svg.contains(needle), "no {needle:?} in the SVG");
        }

        let text = summary(&r, false);
        assert!(text.contains("GPU 1"), "{text}");
        assert!(text.contains("killed by SIGTERM (status 143)"), "{text}");
        assert!(text.contains("400 MiB peak (exact)"), "{text}");
        assert!(text.contains("forwarded to the child"), "{text}");
    }

    #[test]
    fn exact_gpu_figures_in_every_output_and_the_schema_agrees() {
        use crate::commands::run::gpu_exact::{ExactProcess, ExactRecord};
        let (mut rec, facts) = full();
        rec.gpu_exact = Some(ExactRecord {
            library: "/opt/memprobe/lib/libmemprobe_interpose.so".into(),
            tree_peak: vec![9 << 20, 7 << 20],
            tree_end: vec![1 << 20, 0],
            tree_host_pinned_peak: 0,
            processes: vec![
                ExactProcess {
                    pid: 100,
                    exited: true,
                    peak: vec![6 << 20],
                    end: vec![1 << 20],
                    ..ExactProcess::default()
                },
                ExactProcess {
                    pid: 101,
                    exited: true,
                    peak: vec![3 << 20, 7 << 20],
                    end: vec![0, 0],
                    not_counted_calls: 2,
                    ..ExactProcess::default()
                },
            ],
            ..ExactRecord::default()
        });
        let r = build(&rec, &facts);
        let json = serde_json::to_value(&r).unwrap();
        let errors = crate::schema_check::check(
            &crate::schema_check::load("docs/run-output.schema.json"),
            &json,
        );
        assert!(errors.is_empty(), "{errors:#?}");
        let x = &json["gpu_exact"];
        assert_eq!(x["devices"][0]["tree_peak_bytes"], 9 << 20);
        assert_eq!(x["devices"][0]["max_process_pid"], 100);
        assert_eq!(x["devices"][1]["max_process_pid"], 101);
        assert_eq!(x["processes"][0]["peak_bytes"][1], 0);
        assert_eq!(json["timeline"][1]["gpu_exact_peak_bytes"][1], 7 << 20);
        assert_eq!(json["timeline"][0]["gpu_exact_peak_bytes"][1], 0);

        let csv = crate::commands::run::timeline_csv::render(&r);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some(
                "t_s,tree_rss_bytes,processes,cgroup_bytes,gpu0_used_bytes,gpu1_used_bytes,\
                 gpu0_exact_peak_bytes,gpu1_exact_peak_bytes"
            )
        );
        assert!(lines.next().unwrap().ends_with(",1048576,0"));
        assert!(lines.next().unwrap().ends_with(",3145728,7340032"));

        let svg = crate::commands::run::plot::render(&r).unwrap();
        assert!(
            svg.contains("GPU 1 exact, all processes of the run"),
            "no exact series"
        );
        assert!(
            svg.contains("GPU 0 exact tree peak 9.00 MiB"),
            "no exact footer"
        );

        let text = summary(&r, false);
        assert!(text.contains("GPU 0 exact peak"), "{text}");
        assert!(text.contains("9.00 MiB tree (exact"), "{text}");
        assert!(text.contains("largest process pid 101 7.00 MiB"), "{text}");
        assert!(text.contains("pid 101"), "{text}");
        assert!(
            text.contains("2 allocation(s) passed through uncounted"),
            "{text}"
        );

        // Without --gpu-exact nothing of it appears.
        rec.gpu_exact = None;
        let json = serde_json::to_value(build(&rec, &facts)).unwrap();
        assert!(json.get("gpu_exact").is_none());
        assert!(json["timeline"][1].get("gpu_exact_peak_bytes").is_none());
    }

    #[test]
    fn quoting() {
        let argv = vec![
            "python".to_string(),
            "-c".into(),
            "print('hi there')".into(),
        ];
        assert_eq!(
            command_line(&argv, 100),
            r"python -c 'print('\''hi there'\'')'"
        );
        let argv = vec!["sh".to_string(), "-c".into(), "a\nb".into()];
        assert_eq!(command_line(&argv, 100), r"sh -c a\nb");
        assert_eq!(command_line(&argv, 6), "sh ...");
    }
}
