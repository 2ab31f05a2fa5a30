//! The ranks of a job of several processes (torchrun, MPI, Slurm) in
//! `run`'s outputs: each process that sent its ranks over the run channel
//! (memprobe-core's `run_channel::ranks`) is named by its rank beside its
//! pid, and each phase that several ranks ran gets a line comparing them:
//! the rank with the highest peak, the one with the lowest, and their
//! spread (a rank using 20 % more than its peers is what people look for).
//!
//! A run whose processes sent no ranks shows none of it: its outputs are
//! what they were.

use crate::units;
use memprobe_core::Ranks;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// At most this many rank lines in the summary: those with the largest
/// spreads, in their order (the JSON has every one).
pub(crate) const SUMMARY_LINES: usize = 8;

/// A process's ranks in the JSON, flattened into the object of the
/// process, phase or peak they belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct RankFields {
    pub(crate) rank: u32,
    /// Null when its launcher sets none (PMI).
    pub(crate) local_rank: Option<u32>,
    pub(crate) world_size: u32,
}

impl From<Ranks> for RankFields {
    fn from(r: Ranks) -> RankFields {
        RankFields {
            rank: r.rank,
            local_rank: r.local_rank,
            world_size: r.world_size,
        }
    }
}

/// One sending process and its ranks (`phase_channel.ranks[]`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SenderRanks {
    pub(crate) pid: u32,
    #[serde(flatten)]
    pub(crate) ranks: RankFields,
}

/// One phase (or the steps) that several ranks ran, compared across them
/// for one source (`phase_channel.rank_spread[]`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RankSpreadReport {
    /// The phase's label (`epoch 0`, `stream 0 / experience 1`), or
    /// `steps` for each rank's largest step.
    pub(crate) label: String,
    /// The phase's kind, `step` for the steps.
    pub(crate) kind: &'static str,
    pub(crate) source: String,
    pub(crate) fidelity: String,
    /// How many ranks ran it.
    pub(crate) ranks: u32,
    pub(crate) max_rank: u32,
    pub(crate) max_pid: u32,
    pub(crate) max_bytes: u64,
    /// For the steps: where the highest rank's largest step was.
    pub(crate) max_step: Option<String>,
    pub(crate) min_rank: u32,
    pub(crate) min_pid: u32,
    pub(crate) min_bytes: u64,
    pub(crate) min_step: Option<String>,
    /// How much more the highest rank used than the lowest, in percent of
    /// the lowest; null when the lowest is 0.
    pub(crate) spread_percent: Option<f64>,
}

/// `pid 1235 (rank 1)`, or `pid 1235` for a process without a rank.
pub(crate) fn who(pid: u32, ranks: Option<RankFields>) -> String {
    match ranks {
        Some(r) => format!("pid {pid} (rank {})", r.rank),
        None => format!("pid {pid}"),
    }
}

/// `, rank 1` to follow a pid inside parentheses, or nothing.
pub(crate) fn after_pid(ranks: Option<RankFields>) -> String {
    ranks.map_or_else(String::new, |r| format!(", rank {}", r.rank))
}

/// One rank's highest value seen, and the pid (and step) it came from.
#[derive(Debug, Clone)]
struct Best {
    bytes: u64,
    pid: u32,
    step: Option<String>,
}

/// Per rank, its [`Best`].
type PerRank = BTreeMap<u32, Best>;

/// What one comparison line gathers while the phases are read.
struct Group {
    label: String,
    kind: &'static str,
    source: String,
    fidelity: String,
    per_rank: PerRank,
}

impl Group {
    fn add(&mut self, rank: u32, bytes: u64, pid: u32, step: Option<String>) {
        let new = Best { bytes, pid, step };
        match self.per_rank.entry(rank) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(new);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                if bytes > o.get().bytes {
                    o.insert(new);
                }
            }
        }
    }

    /// The line, when at least two ranks ran it.
    fn report(self) -> Option<RankSpreadReport> {
        if self.per_rank.len() < 2 {
            return None;
        }
        // Ties go to the lowest rank (the map is in rank order).
        let mut max: Option<(u32, &Best)> = None;
        let mut min: Option<(u32, &Best)> = None;
        for (&rank, v) in &self.per_rank {
            if max.map_or(true, |(_, m)| v.bytes > m.bytes) {
                max = Some((rank, v));
            }
            if min.map_or(true, |(_, m)| v.bytes < m.bytes) {
                min = Some((rank, v));
            }
        }
        let ((max_rank, hi), (min_rank, lo)) = (max?, min?);
        Some(RankSpreadReport {
            label: self.label,
            kind: self.kind,
            source: self.source,
            fidelity: self.fidelity,
            ranks: self.per_rank.len() as u32,
            max_rank,
            max_pid: hi.pid,
            max_bytes: hi.bytes,
            max_step: hi.step.clone(),
            min_rank,
            min_pid: lo.pid,
            min_bytes: lo.bytes,
            min_step: lo.step.clone(),
            spread_percent: (lo.bytes > 0)
                .then(|| (hi.bytes - lo.bytes) as f64 * 100.0 / lo.bytes as f64),
        })
    }
}

/// One peak of one source in a phase, or a rank's largest step, of a
/// process that sent its ranks: what [`spread`] compares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankedPeak<'a> {
    /// The phase's label; for a step, the step's (`epoch 0 / step 2`).
    pub(crate) label: &'a str,
    /// The phase's kind.
    pub(crate) kind: &'static str,
    pub(crate) source: &'a str,
    pub(crate) fidelity: &'a str,
    pub(crate) rank: u32,
    pub(crate) pid: u32,
    pub(crate) bytes: u64,
}

/// The comparison lines: per phase label that several ranks ran and per
/// source of its records, the ranks' peaks (a rank with several processes
/// sending the same label counts its highest); then per source, each
/// rank's largest step. In the order the phases began.
pub(crate) fn spread<'a>(
    phases: impl IntoIterator<Item = RankedPeak<'a>>,
    steps: impl IntoIterator<Item = RankedPeak<'a>>,
) -> Vec<RankSpreadReport> {
    let mut groups: Vec<Group> = Vec::new();
    let mut at: HashMap<(String, String), usize> = HashMap::new();
    for p in phases {
        let key = (p.label.to_string(), p.source.to_string());
        let i = *at.entry(key).or_insert_with(|| {
            groups.push(Group {
                label: p.label.to_string(),
                kind: p.kind,
                source: p.source.to_string(),
                fidelity: p.fidelity.to_string(),
                per_rank: PerRank::new(),
            });
            groups.len() - 1
        });
        groups[i].add(p.rank, p.bytes, p.pid, None);
    }
    let mut by_source: Vec<Group> = Vec::new();
    for p in steps {
        let i = match by_source.iter().position(|g| g.source == p.source) {
            Some(i) => i,
            None => {
                by_source.push(Group {
                    label: "steps".into(),
                    kind: "step",
                    source: p.source.to_string(),
                    fidelity: p.fidelity.to_string(),
                    per_rank: PerRank::new(),
                });
                by_source.len() - 1
            }
        };
        by_source[i].add(p.rank, p.bytes, p.pid, Some(p.label.to_string()));
    }
    groups
        .into_iter()
        .chain(by_source)
        .filter_map(Group::report)
        .collect()
}

/// `+49 %` (one decimal under 10 %).
fn percent(p: f64) -> String {
    if p < 10.0 {
        format!("+{p:.1} %")
    } else {
        format!("+{p:.0} %")
    }
}

/// One summary line: `epoch 0: max rank 1 612 MiB, min rank 0 410 MiB,
/// spread +49 % (rss, 2 ranks)`.
pub(crate) fn line(s: &RankSpreadReport) -> String {
    let at = |step: &Option<String>| {
        step.as_ref()
            .map_or_else(String::new, |l| format!(" ({})", l.replace(" / ", ", ")))
    };
    format!(
        "{}: max rank {} {}{}, min rank {} {}{}, spread {} ({}, {} ranks)",
        s.label.replace(" / ", ", "),
        s.max_rank,
        units::bytes(s.max_bytes),
        at(&s.max_step),
        s.min_rank,
        units::bytes(s.min_bytes),
        at(&s.min_step),
        s.spread_percent.map_or_else(|| "-".into(), percent),
        s.source,
        s.ranks
    )
}

/// The summary's rank lines: all of them up to [`SUMMARY_LINES`], else
/// those with the largest spreads, in order, and a note of how many were
/// left out.
pub(crate) fn summary_lines(all: &[RankSpreadReport]) -> Vec<String> {
    let mut shown: Vec<usize> = (0..all.len()).collect();
    if all.len() > SUMMARY_LINES {
        shown.sort_by(|&a, &b| {
            let key = |i: usize| all[i].spread_percent.unwrap_or(f64::INFINITY);
            key(b).total_cmp(&key(a)).then(a.cmp(&b))
        });
        shown.truncate(SUMMARY_LINES);
        shown.sort_unstable();
    }
    let mut out: Vec<String> = shown.iter().map(|&i| line(&all[i])).collect();
    if all.len() > SUMMARY_LINES {
        out.push(format!(
            "(the {SUMMARY_LINES} largest spreads of {} shown; every one is in --json)",
            all.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread_of(label: &str, max: u64, min: u64) -> RankSpreadReport {
        RankSpreadReport {
            label: label.into(),
            kind: "epoch",
            source: "rss".into(),
            fidelity: "exact".into(),
            ranks: 2,
            max_rank: 1,
            max_pid: 11,
            max_bytes: max,
            max_step: None,
            min_rank: 0,
            min_pid: 10,
            min_bytes: min,
            min_step: None,
            spread_percent: (min > 0).then(|| (max - min) as f64 * 100.0 / min as f64),
        }
    }

    use crate::commands::run::child::ExitInfo;
    use crate::commands::run::phase_log::{Event, Message, PhaseLog, SourceRecord};
    use crate::commands::run::recording::{ProcessRecord, Recording};
    use crate::commands::run::report::{add_rusage, build, summary, RunFacts, RunReport};
    use crate::commands::run::timeline::Point;
    use memprobe_core::PhaseKind;
    use std::time::Duration;

    const MS: u64 = 1_000_000;
    const MIB: u64 = 1 << 20;

    fn process(pid: u32, ppid: u32, name: &str, peak: u64) -> ProcessRecord {
        ProcessRecord {
            pid,
            ppid: Some(ppid),
            name: name.into(),
            first_seen_ns: 0,
            last_seen_ns: 40 * MS,
            exited: true,
            vmhwm: Some(peak),
            max_sampled_rss: peak,
            rusage_maxrss: None,
            rusage_children: None,
            last_rss: peak,
            ended_ns: Some(40 * MS),
            wait_status: None,
            exit_hwm: None,
            kinds_at_peak: None,
        }
    }

    /// torchrun (pid 500) and its two workers, pids 501 and 502, ranks 0
    /// and 1 (unless `with_ranks` is false): two epochs of five 2 ms
    /// steps each; rank 0 peaks at 410 MiB then 400 MiB, rank 1 at 612 MiB
    /// (step 2 of epoch 0) then 420 MiB.
    fn two_workers(with_ranks: bool) -> RunReport {
        let mut log = PhaseLog::new(0);
        for (pid, rank, peaks) in [(501u32, 0u32, [410, 400]), (502, 1, [612, 420])] {
            let mut seq = 0;
            let mut add = |kind: PhaseKind, index: u64, depth: u32, event: Event| {
                log.add(Message {
                    pid,
                    tracker: 1,
                    seq,
                    dropped: 0,
                    dropped_steps: 0,
                    ranks: with_ranks.then_some(Ranks {
                        rank,
                        local_rank: Some(rank),
                        world_size: 2,
                    }),
                    kind,
                    name: kind.as_str().into(),
                    index,
                    depth,
                    event,
                });
                seq += 1;
            };
            let rec = |peak: u64| {
                vec![SourceRecord {
                    name: "rss".into(),
                    kind: "process".into(),
                    fidelity: "exact".into(),
                    used_start: 300 * MIB,
                    used_end: 300 * MIB,
                    peak,
                    delta_used: 0,
                    delta_peaked: peak - 300 * MIB,
                }]
            };
            let end = |s: u64, e: u64, next: bool, peak: u64| Event::End {
                started_ns: s,
                ended_ns: e,
                next,
                releases: 0,
                sources: rec(peak),
                truncated: false,
            };
            let mut t = 0;
            for (e, epoch_peak) in peaks.iter().enumerate() {
                let (e, e0) = (e as u64, t);
                add(PhaseKind::Epoch, e, 0, Event::Begin { t_ns: t });
                add(PhaseKind::Step, e * 5, 1, Event::Begin { t_ns: t });
                for i in 0..5u64 {
                    let peak = if i == 2 { *epoch_peak } else { 350 };
                    add(
                        PhaseKind::Step,
                        e * 5 + i,
                        1,
                        end(t, t + 2 * MS, i < 4, peak * MIB),
                    );
                    t += 2 * MS;
                }
                add(PhaseKind::Epoch, e, 0, end(e0, t, false, epoch_peak * MIB));
            }
        }
        let mut rec = Recording::default();
        for at in 0..=20u64 {
            let t = at * 2 * MS;
            rec.add_point(Point {
                t_ns: t,
                tree_rss: 1200 * MIB,
                processes: 3,
                cgroup: None,
                gpus: Vec::new(),
                gpu_exact: Vec::new(),
                tree_pss: None,
                tree_uss: None,
            });
            rec.lines.observe(500, 100 * MIB, t, t);
            rec.lines.observe(501, 400 * MIB, t, t);
            rec.lines
                .observe(502, if at == 2 { 612 * MIB } else { 420 * MIB }, t, t);
        }
        rec.processes = vec![
            process(500, 1, "torchrun", 100 * MIB),
            process(501, 500, "python3", 410 * MIB),
            process(502, 500, "python3", 612 * MIB),
        ];
        rec.processes_seen = 3;
        rec.phases = Some(log);
        let facts = RunFacts {
            command: vec!["torchrun".into(), "train.py".into()],
            pid: 500,
            interval: Duration::from_millis(2),
            started_at_unix_s: 1.7e9,
            duration_s: 0.04,
            exit: ExitInfo {
                code: Some(0),
                signal: None,
                core_dumped: false,
                maxrss_bytes: 612 * MIB,
                cpu_s: 0.1,
            },
            signals: Vec::new(),
            memprobe_cpu_s: 0.01,
            torch_attribution: Vec::new(),
        };
        add_rusage(&mut rec, &facts, Some(true));
        build(&rec, &facts)
    }

    #[test]
    fn ranks_are_named_in_the_json_the_summary_and_the_chart_and_compared() {
        let r = two_workers(true);
        let json = serde_json::to_value(&r).unwrap();
        let errors = crate::schema_check::check(
            &crate::schema_check::load("docs/run-output.schema.json"),
            &json,
        );
        assert!(errors.is_empty(), "{errors:#?}");
        let c = &json["phase_channel"];
        assert_eq!(
            c["ranks"],
            serde_json::json!([
                {"pid": 501, "rank": 0, "local_rank": 0, "world_size": 2},
                {"pid": 502, "rank": 1, "local_rank": 1, "world_size": 2},
            ])
        );
        let of = |pid: u64| {
            json["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pid"] == pid)
                .unwrap()
                .clone()
        };
        assert_eq!(
            (of(502)["rank"].as_u64(), of(502)["world_size"].as_u64()),
            (Some(1), Some(2))
        );
        assert!(of(500).get("rank").is_none(), "torchrun itself has no rank");
        assert_eq!(json["peak_process"]["rank"], 1);
        let phase = &json["phases"][2];
        assert_eq!(
            (phase["pid"].as_u64(), phase["rank"].as_u64()),
            (Some(502), Some(1))
        );
        assert_eq!(c["peaks"][1]["rank"], 1);

        let spread = c["rank_spread"].as_array().unwrap();
        assert_eq!(spread.len(), 3, "{spread:#?}");
        let e0 = &spread[0];
        assert_eq!(
            (
                &e0["label"],
                &e0["max_rank"],
                &e0["min_rank"],
                &e0["max_pid"]
            ),
            (&"epoch 0".into(), &1.into(), &0.into(), &502.into())
        );
        assert_eq!(
            (e0["max_bytes"].as_u64(), e0["min_bytes"].as_u64()),
            (Some(612 * MIB), Some(410 * MIB))
        );
        let pct = e0["spread_percent"].as_f64().unwrap();
        assert!((pct - 49.27).abs() < 0.01, "{pct}");
        assert_eq!(spread[1]["label"], "epoch 1");
        assert_eq!(spread[2]["label"], "steps");
        assert_eq!(spread[2]["max_step"], "epoch 0 / step 2");
        assert_eq!(spread[2]["min_step"], "epoch 0 / step 2");

        let text = summary(&r, false);
        for needle in [
            "4 epochs, 20 steps from pid 501 (rank 0), pid 502 (rank 1)",
            "rank spread           epoch 0: max rank 1 612 MiB, min rank 0 410 MiB, spread +49 % (rss, 2 ranks)",
            "rank spread           epoch 1: max rank 1 420 MiB, min rank 0 400 MiB, spread +5.0 % (rss, 2 ranks)",
            "rank spread           steps: max rank 1 612 MiB (epoch 0, step 2), min rank 0 410 MiB (epoch 0, step 2), spread +49 %",
            "peak rss              612 MiB in epoch 0, step 2 (#2 of its epoch) (pid 502, rank 1), exact",
            "pid 502 (python3, rank 1), exact",
            "RANK",
        ] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
        let svg = crate::commands::run::plot::render(&r).unwrap();
        for needle in [
            "pid 502 (rank 1) python3 (peak 612 MiB)",
            "pid 500 torchrun",
            "in epoch 0, step 2 (pid 502, rank 1)",
            "(pid 502, rank 1, python3, exact)",
        ] {
            assert!(svg.contains(needle), "no {needle:?} in the SVG");
        }
    }

    #[test]
    fn a_run_without_ranks_shows_none() {
        let r = two_workers(false);
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            !json.contains("rank") && !json.contains("world_size"),
            "{json}"
        );
        let text = summary(&r, false);
        assert!(!text.contains("rank") && !text.contains("RANK"), "{text}");
        assert!(text.contains("20 steps from pids 501, 502"), "{text}");
        let svg = crate::commands::run::plot::render(&r).unwrap();
        assert!(!svg.contains("rank"));
        assert!(svg.contains("pid 502 python3 (peak 612 MiB)"));
    }

    #[test]
    fn lines_read_as_the_docs_say() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            line(&spread_of("epoch 0", 612 * MIB, 410 * MIB)),
            "epoch 0: max rank 1 612 MiB, min rank 0 410 MiB, spread +49 % (rss, 2 ranks)"
        );
        assert_eq!(
            line(&spread_of("epoch 0", 412 * MIB, 410 * MIB)),
            "epoch 0: max rank 1 412 MiB, min rank 0 410 MiB, spread +0.5 % (rss, 2 ranks)"
        );
        assert!(line(&spread_of("x 0", 5, 0)).contains("spread - "));
        assert_eq!(who(7, None), "pid 7");
        let r = Some(RankFields {
            rank: 3,
            local_rank: None,
            world_size: 4,
        });
        assert_eq!(who(7, r), "pid 7 (rank 3)");
        assert_eq!(after_pid(r), ", rank 3");
        assert_eq!(after_pid(None), "");
    }

    #[test]
    fn a_long_list_keeps_the_largest_spreads_in_order() {
        let all: Vec<RankSpreadReport> = (0..20u64)
            .map(|i| {
                spread_of(
                    &format!("epoch {i}"),
                    100 + if i == 13 { 90 } else { i },
                    100,
                )
            })
            .collect();
        let lines = summary_lines(&all);
        assert_eq!(lines.len(), SUMMARY_LINES + 1);
        assert!(lines[0].starts_with("epoch 12:"), "{lines:#?}");
        assert!(lines.iter().any(|l| l.starts_with("epoch 13:")));
        assert!(lines[SUMMARY_LINES].contains("every one is in --json"));
        assert_eq!(summary_lines(&all[..3]).len(), 3);
    }
}
