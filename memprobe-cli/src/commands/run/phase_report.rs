//! The command's phases in `run`'s outputs: the JSON's `phases` and
//! `phase_channel` (the summary's lines about them are in
//! `report/phases.rs`, which reads these).
//!
//! Each kept phase (epoch, experience, stream, custom) gets two views of
//! its interval: memprobe's own samples within it (the tree, the
//! container, each GPU: sampled, so an interval shorter than the sampling
//! interval may hold none) and the program's own record (its sources'
//! peaks, exact where its tracker measures them so). Steps appear as
//! aggregates: per phase, how many and which step held each source's peak.
//! Processes that are ranks of a job are named by their ranks, and phases
//! several ranks ran are compared across them ([`super::ranks`]).

use super::gpu_exact::ExactRecord;
use super::gpu_origins::OriginsAtPeak;
use super::phase_log::{Phase, PhaseLog, SourceRecord, StepAggregate, StepPeak};
use super::ranks::{self, RankFields, RankSpreadReport, RankedPeak, SenderRanks};
use super::timeline::{max_opt, Timeline};
use super::tree_origins::{Spans, TreeOrigins};
use serde::Serialize;

fn s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// One kept phase in the JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PhaseReport {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    /// The sender's ranks (absent for a process without).
    #[serde(flatten)]
    pub(crate) ranks: Option<RankFields>,
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    pub(crate) index: u64,
    pub(crate) depth: u32,
    pub(crate) parent: Option<usize>,
    pub(crate) label: String,
    pub(crate) start_s: f64,
    pub(crate) end_s: Option<f64>,
    pub(crate) ended: bool,
    pub(crate) sources: Vec<PhaseSourceReport>,
    pub(crate) sources_truncated: bool,
    pub(crate) releases: u64,
    pub(crate) run: IntervalReport,
    pub(crate) steps: StepsReport,
}

/// One source of a phase's record.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PhaseSourceReport {
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) fidelity: String,
    pub(crate) used_start_bytes: u64,
    pub(crate) used_end_bytes: u64,
    pub(crate) peak_bytes: u64,
    pub(crate) delta_used_bytes: i64,
    pub(crate) delta_peaked_bytes: u64,
}

/// memprobe's own samples within an interval.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct IntervalReport {
    pub(crate) samples: u64,
    pub(crate) tree_peak_bytes: Option<u64>,
    pub(crate) cgroup_peak_bytes: Option<u64>,
    pub(crate) gpu_peak_bytes: Vec<Option<u64>>,
    /// With `--gpu-exact`: per device ordinal, the tree's exact peak over
    /// the ticks within the interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gpu_exact_peak_bytes: Option<Vec<u64>>,
    /// With `--gpu-exact`: per device ordinal, what held that peak by
    /// origin, where a tick saw the tree whole at it (tree_origins.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gpu_origins_at_peak: Option<Vec<Option<OriginsAtPeak>>>,
}

/// Steps within a phase.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StepsReport {
    pub(crate) count: u64,
    pub(crate) first_index: Option<u64>,
    pub(crate) peaks: Vec<StepPeakReport>,
}

/// The step holding one source's peak.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StepPeakReport {
    pub(crate) source: String,
    pub(crate) peak_bytes: u64,
    pub(crate) index: u64,
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
}

/// What came over the channel, and where each source peaked.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PhaseChannelReport {
    pub(crate) received: u64,
    pub(crate) dropped: u64,
    /// Steps in the lost messages that were batches of steps (the rest of
    /// the lost messages were boundaries).
    pub(crate) dropped_steps: u64,
    pub(crate) garbled: u64,
    pub(crate) oversized: u64,
    pub(crate) unknown_version: u64,
    pub(crate) processes: Vec<u32>,
    pub(crate) steps: u64,
    pub(crate) phases_not_kept: u64,
    pub(crate) peaks: Vec<PeakReport>,
    pub(crate) steps_outside_phases: Vec<LooseStepsReport>,
    /// The senders that are ranks of a job, with their ranks (absent when
    /// none is).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) ranks: Vec<SenderRanks>,
    /// Per phase several ranks ran, and per source, the ranks compared
    /// (absent when no phase was run by two ranks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) rank_spread: Vec<RankSpreadReport>,
}

impl PhaseChannelReport {
    /// The ranks of process `pid`, if it sent any.
    pub(crate) fn rank_of(&self, pid: u32) -> Option<RankFields> {
        self.ranks.iter().find(|s| s.pid == pid).map(|s| s.ranks)
    }
}

/// Where one source of one process peaked.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeakReport {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    #[serde(flatten)]
    pub(crate) ranks: Option<RankFields>,
    pub(crate) source: String,
    pub(crate) fidelity: String,
    pub(crate) peak_bytes: u64,
    /// `epoch 2 / step 17`.
    pub(crate) label: String,
    pub(crate) step_index: Option<u64>,
    /// The step's place among the steps of its phase, from 0.
    pub(crate) step_in_phase: Option<u64>,
    pub(crate) phase: Option<usize>,
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
    /// With `--gpu-exact`, for a step: per device ordinal, what held the
    /// tree's GPU memory at its highest inside the step, where that moment
    /// is known (tree_origins.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gpu_origins_at_peak: Option<Vec<Option<OriginsAtPeak>>>,
}

/// Steps ended outside any kept phase of one tracker.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LooseStepsReport {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    #[serde(flatten)]
    pub(crate) ranks: Option<RankFields>,
    pub(crate) count: u64,
    pub(crate) peaks: Vec<StepPeakReport>,
}

/// Maxima over ranges of a series, in blocks: a query costs at most two
/// partial blocks and one pass over the block maxima.
struct RangeMax {
    values: Vec<Option<u64>>,
    blocks: Vec<Option<u64>>,
}

const BLOCK: usize = 256;

impl RangeMax {
    fn new(values: Vec<Option<u64>>) -> RangeMax {
        let blocks = values
            .chunks(BLOCK)
            .map(|c| c.iter().copied().fold(None, max_opt))
            .collect();
        RangeMax { values, blocks }
    }

    /// The maximum over `values[lo..hi]`.
    fn max(&self, lo: usize, hi: usize) -> Option<u64> {
        let mut m = None;
        let mut i = lo;
        while i < hi {
            if i % BLOCK == 0 && i + BLOCK <= hi {
                m = max_opt(m, self.blocks[i / BLOCK]);
                i += BLOCK;
            } else {
                m = max_opt(m, self.values[i]);
                i += 1;
            }
        }
        m
    }
}

/// The timeline's series, ready for interval queries.
struct Series<'a> {
    times: Vec<u64>,
    tree: RangeMax,
    cgroup: RangeMax,
    gpus: Vec<RangeMax>,
    /// With `--gpu-exact`: the tree's exact interval peaks per device, and
    /// where their breakdowns are.
    exact: Option<(Vec<RangeMax>, Breakdowns<'a>)>,
}

/// The tree's breakdowns by origin: the spans it was seen whole in, and
/// per device the one at its exact peak.
struct Breakdowns<'a> {
    spans: &'a [Spans],
    at_tree_peak: Vec<Option<TreeOrigins>>,
}

impl Breakdowns<'_> {
    /// What held `peak` bytes on device `d` at a moment within
    /// `[start, end]`: the tree's peak's own breakdown when it was then,
    /// else a span seen at a tick then.
    fn at(&self, d: usize, peak: u64, start: u64, end: u64) -> Option<OriginsAtPeak> {
        let in_phase = |t: f64| (start as f64 / 1e9..=end as f64 / 1e9).contains(&t);
        if let Some(o) = self
            .at_tree_peak
            .get(d)
            .and_then(Option::as_ref)
            .filter(|o| o.origins.peak_bytes == peak && o.at_s.is_some_and(in_phase))
        {
            return Some(o.origins.clone());
        }
        let (span, _) = self.spans.get(d)?.at(peak, start, end)?;
        Some(OriginsAtPeak {
            peak_bytes: span.total,
            by_origin: span.by_origin.clone(),
            at_mono_ns: 0,
        })
    }
}

impl<'a> Series<'a> {
    fn new(t: &Timeline, gpus: usize, exact: Option<&'a ExactRecord>) -> Series<'a> {
        let points: Vec<_> = t.points().collect();
        let exact = exact.map(|rec| {
            let n = points.iter().map(|p| p.gpu_exact.len()).max().unwrap_or(0);
            let series = (0..n)
                .map(|i| {
                    RangeMax::new(points.iter().map(|p| p.gpu_exact.get(i).copied()).collect())
                })
                .collect();
            let at_tree_peak = (0..rec.tree_peak.len())
                .map(|d| rec.origins_at_tree_peak(d).ok().flatten())
                .collect();
            (
                series,
                Breakdowns {
                    spans: &rec.tree_spans,
                    at_tree_peak,
                },
            )
        });
        Series {
            exact,
            times: points.iter().map(|p| p.t_ns).collect(),
            tree: RangeMax::new(points.iter().map(|p| Some(p.tree_rss)).collect()),
            cgroup: RangeMax::new(points.iter().map(|p| p.cgroup).collect()),
            gpus: (0..gpus)
                .map(|i| {
                    RangeMax::new(
                        points
                            .iter()
                            .map(|p| p.gpus.get(i).copied().flatten())
                            .collect(),
                    )
                })
                .collect(),
        }
    }

    /// For a step (usually shorter than a tick): per device, what held the
    /// tree's highest inside `[start, end]`: a tick's, or the tree's peak's
    /// own when that moment falls inside.
    fn step_origins(&self, start: u64, end: u64) -> Option<Vec<Option<OriginsAtPeak>>> {
        let (e, b) = self.exact.as_ref()?;
        let lo = self.times.partition_point(|&t| t < start);
        let hi = self.times.partition_point(|&t| t <= end);
        let in_step = |t: f64| (start as f64 / 1e9..=end as f64 / 1e9).contains(&t);
        Some(
            e.iter()
                .enumerate()
                .map(|(d, g)| match g.max(lo, hi).filter(|&p| p > 0) {
                    Some(peak) => b.at(d, peak, start, end),
                    None => b
                        .at_tree_peak
                        .get(d)?
                        .as_ref()
                        .filter(|o| o.at_s.is_some_and(in_step))
                        .map(|o| o.origins.clone()),
                })
                .collect(),
        )
    }

    fn within(&self, start: u64, end: u64) -> IntervalReport {
        let lo = self.times.partition_point(|&t| t < start);
        let hi = self.times.partition_point(|&t| t <= end);
        IntervalReport {
            samples: (hi - lo) as u64,
            tree_peak_bytes: self.tree.max(lo, hi),
            cgroup_peak_bytes: self.cgroup.max(lo, hi),
            gpu_peak_bytes: self.gpus.iter().map(|g| g.max(lo, hi)).collect(),
            gpu_exact_peak_bytes: self
                .exact
                .as_ref()
                .map(|(e, _)| e.iter().map(|g| g.max(lo, hi).unwrap_or(0)).collect()),
            gpu_origins_at_peak: self.exact.as_ref().map(|(e, b)| {
                e.iter()
                    .enumerate()
                    .map(|(d, g)| b.at(d, g.max(lo, hi).filter(|&p| p > 0)?, start, end))
                    .collect()
            }),
        }
    }
}

fn step_peaks(a: &StepAggregate) -> Vec<StepPeakReport> {
    a.peaks.iter().map(step_peak).collect()
}

fn step_peak(p: &StepPeak) -> StepPeakReport {
    StepPeakReport {
        source: p.source.clone(),
        peak_bytes: p.peak,
        index: p.index,
        start_s: s(p.start_ns),
        end_s: s(p.end_ns),
    }
}

fn source_report(d: &SourceRecord) -> PhaseSourceReport {
    PhaseSourceReport {
        name: d.name.clone(),
        kind: d.kind.clone(),
        fidelity: d.fidelity.clone(),
        used_start_bytes: d.used_start,
        used_end_bytes: d.used_end,
        peak_bytes: d.peak,
        delta_used_bytes: d.delta_used,
        delta_peaked_bytes: d.delta_peaked,
    }
}

fn phase_report(
    log: &PhaseLog,
    i: usize,
    p: &Phase,
    series: &Series<'_>,
    run_end: u64,
) -> PhaseReport {
    let end = p.end_ns.or(p.over_by_ns).unwrap_or(run_end);
    PhaseReport {
        pid: p.pid,
        tracker: p.tracker,
        ranks: rank_of(log, p.pid),
        kind: p.kind.as_str(),
        name: p.name.clone(),
        index: p.index,
        depth: p.depth,
        parent: p.parent,
        label: log.path(i),
        start_s: s(p.start_ns),
        end_s: p.end_ns.map(s),
        ended: p.end_ns.is_some(),
        sources: p.sources.iter().map(source_report).collect(),
        sources_truncated: p.truncated,
        releases: p.releases,
        run: series.within(p.start_ns, end),
        steps: StepsReport {
            count: p.steps.count,
            first_index: p.steps.first_index,
            peaks: step_peaks(&p.steps),
        },
    }
}

/// The JSON's `phases` and `phase_channel` from the log and the timeline;
/// `run_end_ns` closes the phases still open when the command ended.
pub(crate) fn build(
    log: Option<&PhaseLog>,
    timeline: &Timeline,
    gpus: usize,
    exact: Option<&ExactRecord>,
    run_end_ns: u64,
) -> (Vec<PhaseReport>, PhaseChannelReport) {
    let Some(log) = log else {
        return (Vec::new(), PhaseChannelReport::default());
    };
    let series = Series::new(timeline, gpus, exact);
    let phases: Vec<PhaseReport> = log
        .phases
        .iter()
        .enumerate()
        .map(|(i, p)| phase_report(log, i, p, &series, run_end_ns))
        .collect();
    let mut peaks: Vec<PeakReport> = log
        .peak_steps()
        .map(|p| {
            let within = p.within.map(|i| log.path(i));
            PeakReport {
                pid: p.pid,
                tracker: p.tracker,
                ranks: rank_of(log, p.pid),
                source: p.step.source.clone(),
                fidelity: fidelity_of(log, p.pid, &p.step.source),
                peak_bytes: p.step.peak,
                label: match within {
                    Some(w) => format!("{w} / step {}", p.step.index),
                    None => format!("step {}", p.step.index),
                },
                step_index: Some(p.step.index),
                step_in_phase: p
                    .within
                    .and_then(|i| log.phases[i].steps.first_index)
                    .map(|f| p.step.index.saturating_sub(f)),
                phase: p.within,
                start_s: s(p.step.start_ns),
                end_s: s(p.step.end_ns),
                gpu_origins_at_peak: series.step_origins(p.step.start_ns, p.step.end_ns),
            }
        })
        .collect();
    // Sources of processes that sent no steps: the innermost phase with
    // the largest peak.
    for (i, p) in log.phases.iter().enumerate() {
        for d in &p.sources {
            let known = peaks
                .iter_mut()
                .find(|k| k.pid == p.pid && k.source == d.name);
            match known {
                Some(k) if k.step_index.is_some() => {}
                Some(k)
                    if d.peak > k.peak_bytes
                        || (d.peak == k.peak_bytes
                            && p.depth as usize > depth_of(log, k.phase)) =>
                {
                    *k = phase_peak(log, i, p, d);
                }
                Some(_) => {}
                None => peaks.push(phase_peak(log, i, p, d)),
            }
        }
    }
    peaks.sort_by(|a, b| (a.pid, &a.source).cmp(&(b.pid, &b.source)));
    let rank_spread = ranks::spread(
        phases.iter().flat_map(|p| {
            p.ranks.into_iter().flat_map(move |r| {
                p.sources.iter().map(move |d| RankedPeak {
                    label: &p.label,
                    kind: p.kind,
                    source: &d.name,
                    fidelity: &d.fidelity,
                    rank: r.rank,
                    pid: p.pid,
                    bytes: d.peak_bytes,
                })
            })
        }),
        peaks
            .iter()
            .filter(|p| p.step_index.is_some())
            .flat_map(|p| {
                p.ranks.map(|r| RankedPeak {
                    label: &p.label,
                    kind: "step",
                    source: &p.source,
                    fidelity: &p.fidelity,
                    rank: r.rank,
                    pid: p.pid,
                    bytes: p.peak_bytes,
                })
            }),
    );
    let channel = PhaseChannelReport {
        received: log.received,
        dropped: log.dropped(),
        dropped_steps: log.dropped_steps(),
        garbled: log.garbled,
        oversized: log.oversized,
        unknown_version: log.unknown_version,
        processes: log.senders.keys().copied().collect(),
        steps: log.steps,
        phases_not_kept: log.not_kept,
        peaks,
        steps_outside_phases: log
            .loose_steps()
            .map(|((pid, tracker), a)| LooseStepsReport {
                pid,
                tracker,
                ranks: rank_of(log, pid),
                count: a.count,
                peaks: step_peaks(a),
            })
            .collect(),
        ranks: log
            .senders
            .iter()
            .filter_map(|(&pid, s)| {
                s.ranks.map(|r| SenderRanks {
                    pid,
                    ranks: r.into(),
                })
            })
            .collect(),
        rank_spread,
    };
    (phases, channel)
}

fn rank_of(log: &PhaseLog, pid: u32) -> Option<RankFields> {
    log.ranks_of(pid).map(RankFields::from)
}

fn depth_of(log: &PhaseLog, phase: Option<usize>) -> usize {
    phase.map_or(0, |i| log.phases[i].depth as usize)
}

fn fidelity_of(log: &PhaseLog, pid: u32, source: &str) -> String {
    log.phases
        .iter()
        .filter(|p| p.pid == pid)
        .flat_map(|p| p.sources.iter())
        .find(|d| d.name == source)
        .map_or_else(String::new, |d| d.fidelity.clone())
}

fn phase_peak(log: &PhaseLog, i: usize, p: &Phase, d: &SourceRecord) -> PeakReport {
    PeakReport {
        pid: p.pid,
        tracker: p.tracker,
        ranks: rank_of(log, p.pid),
        source: d.name.clone(),
        fidelity: d.fidelity.clone(),
        peak_bytes: d.peak,
        label: log.path(i),
        step_index: None,
        step_in_phase: None,
        phase: Some(i),
        start_s: s(p.start_ns),
        end_s: s(p.end_ns.unwrap_or(p.start_ns)),
        // A phase's own breakdown is in `phases[].run`.
        gpu_origins_at_peak: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::commands::run::child::ExitInfo;
    use crate::commands::run::phase_log::{Event, Message};
    use crate::commands::run::recording::Recording;
    use crate::commands::run::report::phases::MAX_ROWS;
    use crate::commands::run::report::{build, summary as run_summary, RunFacts, RunReport};
    use crate::commands::run::timeline::Point;
    use memprobe_core::PhaseKind;
    use std::time::Duration;

    const MS: u64 = 1_000_000;
    const MIB: u64 = 1 << 20;

    fn rss(peak: u64) -> Vec<SourceRecord> {
        vec![SourceRecord {
            name: "rss".into(),
            kind: "process".into(),
            fidelity: "exact".into(),
            used_start: 100 * MIB,
            used_end: 100 * MIB,
            peak,
            delta_used: 0,
            delta_peaked: peak - 100 * MIB,
        }]
    }

    /// A run of `epochs` epochs of 10 steps (1 ms each) by pid 500, each
    /// followed by an evaluation stream, with a 900 MiB spike in step
    /// `spike`; the timeline samples every 2 ms.
    pub(crate) fn run_with_phases(epochs: u64, spike: u64) -> RunReport {
        let mut log = PhaseLog::new(0);
        let mut seq = 0;
        let mut add =
            |log: &mut PhaseLog, kind: PhaseKind, index: u64, depth: u32, event: Event| {
                log.add(Message {
                    pid: 500,
                    tracker: 1,
                    seq,
                    dropped: 0,
                    dropped_steps: 0,
                    ranks: None,
                    kind,
                    name: kind.as_str().into(),
                    index,
                    depth,
                    event,
                });
                seq += 1;
            };
        let end = |s: u64, e: u64, next: bool, peak: u64| Event::End {
            started_ns: s,
            ended_ns: e,
            next,
            releases: 0,
            sources: rss(peak),
            truncated: false,
        };
        let mut t = 0;
        let mut step = 0;
        for e in 0..epochs {
            let e0 = t;
            add(&mut log, PhaseKind::Epoch, e, 0, Event::Begin { t_ns: t });
            add(&mut log, PhaseKind::Step, step, 1, Event::Begin { t_ns: t });
            let mut epoch_peak = 100 * MIB;
            for i in 0..10 {
                let peak = if step == spike {
                    900 * MIB
                } else {
                    (110 + e) * MIB
                };
                epoch_peak = epoch_peak.max(peak);
                add(
                    &mut log,
                    PhaseKind::Step,
                    step,
                    1,
                    end(t, t + MS, i < 9, peak),
                );
                t += MS;
                step += 1;
            }
            add(
                &mut log,
                PhaseKind::Epoch,
                e,
                0,
                end(e0, t, false, epoch_peak),
            );
            add(&mut log, PhaseKind::Stream, e, 0, Event::Begin { t_ns: t });
            add(
                &mut log,
                PhaseKind::Stream,
                e,
                0,
                end(t, t + 2 * MS, false, 105 * MIB),
            );
            t += 2 * MS;
        }
        let mut rec = Recording::default();
        let mut at = 0;
        while at <= t {
            // Each epoch takes 12 ms: 10 steps, then a 2 ms stream.
            let spike_at = (spike / 10) * 12 * MS + (spike % 10) * MS;
            let in_spike = (spike_at..spike_at + 2 * MS).contains(&at);
            rec.add_point(Point {
                t_ns: at,
                tree_rss: if in_spike { 950 * MIB } else { 120 * MIB },
                processes: 2,
                cgroup: Some(300 * MIB),
                gpus: Vec::new(),
                gpu_exact: Vec::new(),
                tree_pss: None,
                tree_uss: None,
            });
            at += 2 * MS;
        }
        rec.phases = Some(log);
        let facts = RunFacts {
            command: vec!["train".into()],
            pid: 500,
            interval: Duration::from_millis(2),
            started_at_unix_s: 1.7e9,
            duration_s: t as f64 / 1e9,
            exit: ExitInfo {
                code: Some(0),
                signal: None,
                core_dumped: false,
                maxrss_bytes: 900 * MIB,
                cpu_s: 0.1,
            },
            signals: Vec::new(),
            memprobe_cpu_s: 0.01,
            torch_attribution: Vec::new(),
        };
        crate::commands::run::report::add_rusage(&mut rec, &facts, None);
        build(&rec, &facts)
    }

    #[test]
    fn phases_in_the_json_and_the_summary() {
        let r = run_with_phases(3, 13);
        let json = serde_json::to_value(&r).unwrap();
        let errors = crate::schema_check::check(
            &crate::schema_check::load("docs/run-output.schema.json"),
            &json,
        );
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(json["phases"].as_array().unwrap().len(), 6);
        let e1 = &json["phases"][2];
        assert_eq!(
            (e1["label"].as_str(), e1["steps"]["count"].as_u64()),
            (Some("epoch 1"), Some(10))
        );
        assert_eq!(e1["steps"]["peaks"][0]["index"], 13);
        assert_eq!(e1["sources"][0]["peak_bytes"], 900 * MIB);
        assert_eq!(e1["run"]["tree_peak_bytes"], 950 * MIB, "{e1}");
        assert_eq!(json["phases"][0]["run"]["tree_peak_bytes"], 120 * MIB);
        let peak = &json["phase_channel"]["peaks"][0];
        assert_eq!(
            (peak["label"].as_str(), peak["step_in_phase"].as_u64()),
            (Some("epoch 1 / step 13"), Some(3))
        );
        let text = run_summary(&r, false);
        assert!(
            text.contains("3 streams, 3 epochs, 30 steps from pid 500"),
            "{text}"
        );
        assert!(
            text.contains(
                "peak rss              900 MiB in epoch 1, step 13 (#3 of its epoch), exact"
            ),
            "{text}"
        );
        assert!(text.contains("step 13 rss 900 MiB"), "{text}");
        assert!(!text.contains("not shown"), "{text}");
    }

    #[test]
    fn a_hundred_and_twenty_epochs_stay_readable() {
        let r = run_with_phases(120, 777);
        let text = run_summary(&r, false);
        let rows = text.lines().filter(|l| l.starts_with("    ")).count();
        assert!(rows <= MAX_ROWS + 6, "{rows} rows:\n{text}");
        let row = text
            .lines()
            .find(|l| l.contains("epoch 77 "))
            .unwrap_or_else(|| panic!("the spike's epoch is not shown:\n{text}"));
        assert!(
            row.contains("950 MiB") && row.contains("step 777 rss 900 MiB"),
            "{row}"
        );
        assert!(
            text.contains("epoch 0 ") && text.contains("stream 119 "),
            "{text}"
        );
        assert!(text.contains("not shown"), "{text}");
        assert!(text.contains("every phase is in --json"), "{text}");
        assert_eq!(r.phases.len(), 240);
    }

    #[test]
    fn range_maxima_match_a_plain_scan() {
        let values: Vec<Option<u64>> = (0..2000u64)
            .map(|i| (i % 7 != 0).then_some((i * 7919) % 1009))
            .collect();
        let rm = RangeMax::new(values.clone());
        for (lo, hi) in [
            (0, 0),
            (0, 1),
            (3, 700),
            (255, 257),
            (256, 512),
            (0, 2000),
            (1999, 2000),
            (700, 1900),
        ] {
            let want = values[lo..hi].iter().copied().fold(None, max_opt);
            assert_eq!(rm.max(lo, hi), want, "{lo}..{hi}");
        }
    }
}
