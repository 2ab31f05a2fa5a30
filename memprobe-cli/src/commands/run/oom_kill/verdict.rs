//! The verdict: a pure function of the recorded evidence ([`Inputs`]),
//! with the victims it names, the likeliest first.

use super::evidence::{Inputs, KernelKill, KernelRecord, Member};
use serde::Serialize;

/// How long a victim may take to die after the kernel counted its kill
/// (its memory is reaped at once, but the task may be in the middle of a
/// system call), at least.
const DEATH_DELAY_NS: u64 = 2_000_000_000;

/// How sure the verdict is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    Confirmed,
    Likely,
    None,
    Unknown,
}

/// What ties a victim to the OOM killer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Evidence {
    /// The kernel's log names it (pid and name).
    KernelLog,
    /// `oom_kill` rose and it died of `SIGKILL` at about that time.
    CounterAndSigkill,
    /// `oom_kill` rose as it ended; how it ended was not seen.
    CounterAndEnd,
    /// It died of `SIGKILL` with the container at its limit; no counter.
    SigkillAtLimit,
}

/// `oom_kill.victims[]` in the JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct VictimReport {
    pub(crate) pid: u32,
    pub(crate) name: String,
    /// When it was seen ended, seconds since the start.
    pub(crate) at_s: f64,
    /// The training phase open at that time: its own where it reports
    /// phases, else its nearest ancestor's, else the run's.
    pub(crate) phase: Option<String>,
    /// Whose phase that is: the victim's own pid, an ancestor's; null when
    /// it is any process's of the run (or there is none).
    pub(crate) phase_pid: Option<u32>,
    pub(crate) direct_child: bool,
    /// Whether its death by `SIGKILL` was seen (else it vanished).
    pub(crate) sigkill_seen: bool,
    /// What ties it to the OOM killer.
    pub(crate) evidence: Evidence,
    /// Null when nothing measured it (a process no sample saw, killed
    /// without the kernel's record of its size).
    pub(crate) peak_bytes: Option<u64>,
    /// `"rusage"`: the exact peak (`wait4`); `"last_rss"`: the last RSS
    /// sampled, for members that are not memprobe's child; `"kernel_log"`:
    /// its RSS when killed, from the kernel's record; `"none"`.
    pub(crate) peak_source: &'static str,
}

/// A kill the kernel logged that is none of the run's processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct OtherKill {
    pub(crate) pid: u32,
    pub(crate) name: String,
    pub(crate) at_s: f64,
    /// Its memory cgroup as the kernel names it; null where not logged.
    pub(crate) memcg: Option<String>,
}

/// `oom_kill` in the JSON: the verdict and its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct OomKillReport {
    pub(crate) verdict: Level,
    /// The counters' file; null when none could be read.
    pub(crate) counters: Option<&'static str>,
    /// How much `oom_kill` rose over the run; null without the counter.
    pub(crate) oom_kill_rise: Option<u64>,
    pub(crate) oom_rise: Option<u64>,
    pub(crate) oom_group_kill_rise: Option<u64>,
    /// Kills counted that match no member of the tree; null where that
    /// cannot be told (no counter, or a process could have lived unseen).
    pub(crate) kills_outside_tree: Option<u64>,
    /// Whether the kernel's log was read (it names each victim).
    pub(crate) kernel_log: bool,
    /// Why not, when it was not.
    pub(crate) kernel_log_unavailable: Option<String>,
    /// The OOM kills it named that were not the run's processes.
    pub(crate) other_kills: Vec<OtherKill>,
    /// `"process_events"`: every birth and death of the tree was seen (the
    /// kernel's process events); `"samples"`: what samples saw, the zombies
    /// they caught and the orphans memprobe reaped.
    pub(crate) tracking: &'static str,
    /// Why tracking is by samples only, when it is.
    pub(crate) tracking_unavailable: Option<String>,
    /// The victims, the likeliest first.
    pub(crate) victims: Vec<VictimReport>,
    pub(crate) container_peak_bytes: Option<u64>,
    pub(crate) container_limit_bytes: Option<u64>,
    /// The summary's paragraph (without the `memprobe: ` prefix); null when
    /// there is nothing to say.
    pub(crate) explanation: Option<String>,
}

/// How close the kernel's record and a death must be (the clocks differ
/// slightly; a victim dies within moments of its record).
const RECORD_SLACK_NS: u64 = 2_000_000_000;

/// A member tied to a kill: the member, what ties it, whether its
/// `SIGKILL` was seen.
type Match<'a> = (&'a Member, Evidence, bool);

/// The verdict, not yet worded (`explanation` is `None`: the folder's
/// `detect` adds it). `phase_at(pid, t)`: the training phase open in
/// process `pid` (or any process of the run, with `None`) at `t` ns on
/// `CLOCK_MONOTONIC`.
pub(super) fn decide(
    inputs: &Inputs,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) -> OomKillReport {
    let counters = inputs.counters;
    let has_counter = counters.has_oom_kill();
    let counted: u64 = counters.kills().iter().map(|k| k.2).sum();
    let (mut matched, other_kills, level) = match inputs.kernel.complete() {
        Some(kills) => named_by_the_kernel(inputs, kills),
        None => {
            let (matched, level) = tied_by_the_counter(inputs, has_counter, counted);
            (matched, Vec::new(), level)
        }
    };
    matched.sort_by_key(|(m, e, seen)| {
        (
            *e != Evidence::KernelLog,
            std::cmp::Reverse(*seen),
            std::cmp::Reverse(peak(m, inputs).0.unwrap_or(0)),
        )
    });
    let victims = victims(&matched, inputs, phase_at);
    let matched_count = u64::try_from(matched.len()).unwrap_or(u64::MAX);
    // Known only where every victim is named, or every birth was seen.
    let kills_outside_tree = if has_counter
        && (inputs.kernel.complete().is_some()
            || inputs.tracking.is_ok()
            || counted <= matched_count)
    {
        Some(counted.saturating_sub(matched_count))
    } else {
        None
    };
    let (kernel_log, kernel_log_unavailable) = match &inputs.kernel {
        KernelRecord::Read { lost: 0, .. } => (true, None),
        KernelRecord::Read { lost, .. } => (
            true,
            Some(format!(
                "{lost} record(s) of the kernel's log were overwritten before memprobe read them"
            )),
        ),
        KernelRecord::Unreadable(why) => (false, Some(why.clone())),
    };
    OomKillReport {
        verdict: level,
        counters: counters.first.and(counters.file),
        oom_kill_rise: counters.rise(|e| e.oom_kill),
        oom_rise: counters.rise(|e| e.oom),
        oom_group_kill_rise: counters.rise(|e| e.oom_group_kill),
        kills_outside_tree,
        kernel_log,
        kernel_log_unavailable,
        other_kills,
        tracking: if inputs.tracking.is_ok() {
            "process_events"
        } else {
            "samples"
        },
        tracking_unavailable: inputs.tracking.clone().err(),
        victims,
        container_peak_bytes: inputs.container.and_then(|c| c.peak),
        container_limit_bytes: inputs.container.and_then(|c| c.limit),
        explanation: None,
    }
}

/// The kernel's record names every victim: nothing is guessed. The run's
/// processes it names, the others it names, and the level.
fn named_by_the_kernel<'a>(
    inputs: &'a Inputs,
    kills: &[KernelKill],
) -> (Vec<Match<'a>>, Vec<OtherKill>, Level) {
    let mut matched: Vec<Match> = Vec::new();
    let mut other_kills = Vec::new();
    for k in kills {
        match inputs.members.iter().find(|m| m.is(k, RECORD_SLACK_NS)) {
            Some(m) if !matched.iter().any(|(x, _, _)| x.pid == m.pid) => {
                matched.push((m, Evidence::KernelLog, m.signal() == Some(libc::SIGKILL)));
            }
            Some(_) => {}
            None => other_kills.push(OtherKill {
                pid: k.pid,
                name: k.name.clone(),
                at_s: k.at_ns as f64 / 1e9,
                memcg: k.memcg.clone(),
            }),
        }
    }
    let level = if matched.is_empty() {
        Level::None
    } else {
        Level::Confirmed
    };
    (matched, other_kills, level)
}

/// The counter says that a process was killed, not which: a death at that
/// time makes it likely, never confirmed. Without a counter, a `SIGKILL`
/// with the container at its limit does.
fn tied_by_the_counter<'a>(
    inputs: &'a Inputs,
    has_counter: bool,
    counted: u64,
) -> (Vec<Match<'a>>, Level) {
    let counters = inputs.counters;
    let mut matched: Vec<Match> = Vec::new();
    let delay = DEATH_DELAY_NS.max(inputs.interval_ns.saturating_mul(5));
    for (after, at, rise) in counters.kills() {
        let mut here: Vec<&Member> = inputs
            .members
            .iter()
            .filter(|m| !m.ended_otherwise())
            .filter(|m| !matched.iter().any(|(x, _, _)| x.pid == m.pid))
            .filter(|m| {
                m.ended_ns.is_some_and(|end| {
                    after < end
                        && m.last_seen_ns.or(m.born_ns).unwrap_or(after) < at.saturating_add(delay)
                })
            })
            .collect();
        // The OOM killer picks the largest: seen SIGKILLs first, then size.
        here.sort_by_key(|m| {
            (
                std::cmp::Reverse(m.signal() == Some(libc::SIGKILL)),
                std::cmp::Reverse(peak(m, inputs).0.unwrap_or(0)),
            )
        });
        for m in here
            .into_iter()
            .take(usize::try_from(rise).unwrap_or(usize::MAX))
        {
            let seen = m.signal() == Some(libc::SIGKILL);
            let evidence = if seen {
                Evidence::CounterAndSigkill
            } else {
                Evidence::CounterAndEnd
            };
            matched.push((m, evidence, seen));
        }
    }
    let mut level = if !matched.is_empty() {
        Level::Likely
    } else if has_counter {
        // The counter rose for nobody seen: a process that lived
        // between two samples could have been it, unless every birth
        // was seen.
        if counted == 0 || inputs.tracking.is_ok() {
            Level::None
        } else {
            Level::Unknown
        }
    } else {
        Level::Unknown
    };
    // No counter to go by: a SIGKILL with the container at its limit.
    if !has_counter {
        if let Some(m) = inputs
            .members
            .iter()
            .filter(|m| m.signal() == Some(libc::SIGKILL))
            .max_by_key(|m| peak(m, inputs).0)
        {
            if inputs.container.is_some_and(|c| c.near_limit()) {
                matched.push((m, Evidence::SigkillAtLimit, true));
                level = Level::Likely;
            }
        }
    }
    (matched, level)
}

/// The victims as the JSON lists them, with the phase open when each ended.
fn victims(
    matched: &[Match],
    inputs: &Inputs,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) -> Vec<VictimReport> {
    matched
        .iter()
        .map(|(m, evidence, seen)| {
            let at = m.ended_ns.or(m.last_seen_ns).unwrap_or(0);
            let (bytes, source) = peak(m, inputs);
            let (phase, phase_pid) = phase_of(m, inputs, at, phase_at);
            VictimReport {
                pid: m.pid,
                name: m.name.clone(),
                at_s: at as f64 / 1e9,
                phase,
                phase_pid,
                direct_child: m.direct_child,
                sigkill_seen: *seen,
                evidence: *evidence,
                peak_bytes: bytes,
                peak_source: source,
            }
        })
        .collect()
}

/// The phase open when `m` ended, and whose it is: its own, else its
/// nearest ancestor's that sent phases (a DataLoader worker sends none; its
/// trainer does), else any process's of the run.
fn phase_of(
    m: &Member,
    inputs: &Inputs,
    at: u64,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) -> (Option<String>, Option<u32>) {
    let t = inputs.t0_monotonic_ns.saturating_add(at);
    let mut pid = Some(m.pid);
    for _ in 0..64 {
        let Some(p) = pid else { break };
        if let Some(phase) = phase_at(Some(p), t) {
            return (Some(phase), Some(p));
        }
        pid = inputs
            .members
            .iter()
            .find(|x| x.pid == p)
            .and_then(|x| x.ppid)
            .filter(|&pp| pp != p);
    }
    (phase_at(None, t), None)
}

/// A member's peak and where it comes from: exact for the command, the
/// last RSS sampled for others, the kernel's record of its RSS for one no
/// sample saw.
fn peak(m: &Member, inputs: &Inputs) -> (Option<u64>, &'static str) {
    if let Some(p) = m.exact_peak {
        return (Some(p), "rusage");
    }
    if m.last_seen_ns.is_some() {
        return (Some(m.last_rss), "last_rss");
    }
    let logged = match &inputs.kernel {
        KernelRecord::Read { kills, .. } => kills
            .iter()
            .find(|k| m.is(k, RECORD_SLACK_NS))
            .and_then(|k| k.rss_bytes),
        KernelRecord::Unreadable(_) => None,
    };
    match logged {
        Some(b) => (Some(b), "kernel_log"),
        None => (None, "none"),
    }
}
