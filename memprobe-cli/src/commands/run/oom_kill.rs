//! Was the run's process killed by the kernel's OOM killer? A pure detector
//! over what the run recorded, and its verdict for the summary and the JSON.
//!
//! The evidence:
//! - the kernel's own log of its kills ([`crate::commands::run::kernel_log`]: pid and name
//!   of each victim), where memprobe may read it (root): the one thing that
//!   ties a kill to a process;
//! - the container's OOM event counters over time ([`CounterLog`]: cgroup
//!   v2 `memory.events`, v1 `memory.oom_control`), read by the sampling
//!   thread at every tick (one small `pread`). They say that a process of
//!   the container was killed, and when, not which;
//! - the tree's members: every birth and death with its wait status from
//!   the kernel's process events ([`crate::commands::run::process_events`], root), else
//!   what samples saw (when each was last seen alive with which RSS, when a
//!   sample first saw it ended, its wait status when caught as a zombie)
//!   and the orphans memprobe reaped as their subreaper;
//! - the direct child's wait status and `ru_maxrss` (its exact peak).
//!
//! Verdicts:
//! - **confirmed**: the kernel's log names a process of the run (pid and
//!   name, alive then);
//! - **likely**: no log to read, but `oom_kill` rose and a member died of
//!   `SIGKILL` (or ended, how unseen) at that time; or a member died of
//!   `SIGKILL` with the container at or near its limit on a machine that
//!   keeps no `oom_kill` counter. A time window alone never confirms: an
//!   unrelated process of the container killed a moment before the user's
//!   own `kill -9` fits it as well;
//! - **none**: the evidence rules it out: the log names no process of the
//!   run; or the counter stayed put (a `SIGKILL` then came from a process,
//!   not the kernel); or it rose while no member ended and every birth and
//!   death was seen;
//! - **unknown**: nothing to tell by: no counter and no log, or a rise
//!   while no member seen ended, with births between samples unseen.

use super::recording::Recording;
use super::report::RunFacts;
use crate::units;
use memprobe_core::cgroup::{CgroupVersion, OomEvents};
use serde::Serialize;

/// At most this many counter changes are kept (each kill is one change at
/// most; a run killed this often has long lost its memory).
const MAX_CHANGES: usize = 4096;

/// How long a victim may take to die after the kernel counted its kill
/// (its memory is reaped at once, but the task may be in the middle of a
/// system call), at least.
const DEATH_DELAY_NS: u64 = 2_000_000_000;

/// The container's OOM event counters over the run: the first reading, then
/// every change, each with the time of the reading before it (the change
/// happened between the two).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CounterLog {
    /// Which file the counters come from; `None` until the cgroup is known.
    pub(crate) file: Option<&'static str>,
    pub(crate) first: Option<(u64, OomEvents)>,
    pub(crate) changes: Vec<Change>,
    last: Option<(u64, OomEvents)>,
    /// Changes dropped beyond [`MAX_CHANGES`].
    pub(crate) dropped: u64,
}

/// One change of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    /// The last reading with the old values, ns since the start.
    pub(crate) after_ns: u64,
    /// The first reading with the new ones.
    pub(crate) at_ns: u64,
    pub(crate) before: OomEvents,
    pub(crate) now: OomEvents,
}

impl CounterLog {
    /// A log of the counters of a cgroup of `version`.
    pub(crate) fn new(version: CgroupVersion) -> CounterLog {
        CounterLog {
            file: Some(match version {
                CgroupVersion::V1 => "memory.oom_control (cgroup v1)",
                CgroupVersion::V2 => "memory.events (cgroup v2)",
            }),
            ..CounterLog::default()
        }
    }

    /// Folds in one reading taken at `now` (`None`: none could be had).
    pub(crate) fn observe(&mut self, now: u64, events: Option<OomEvents>) {
        let Some(events) = events else { return };
        match self.last {
            None => self.first = Some((now, events)),
            Some((then, before)) if before != events => {
                if self.changes.len() < MAX_CHANGES {
                    self.changes.push(Change {
                        after_ns: then,
                        at_ns: now,
                        before,
                        now: events,
                    });
                } else {
                    self.dropped += 1;
                }
            }
            Some(_) => {}
        }
        self.last = Some((now, events));
    }

    /// Whether `oom_kill` was read at all.
    fn has_oom_kill(&self) -> bool {
        self.first.is_some_and(|(_, e)| e.oom_kill.is_some())
    }

    /// The rise of a counter from the first reading to the last.
    fn rise(&self, field: impl Fn(&OomEvents) -> Option<u64>) -> Option<u64> {
        let first = field(&self.first?.1)?;
        let last = field(&self.last?.1)?;
        Some(last.saturating_sub(first))
    }

    /// The intervals in which `oom_kill` rose, with how much.
    fn kills(&self) -> Vec<(u64, u64, u64)> {
        self.changes
            .iter()
            .filter_map(|c| {
                let rise = c.now.oom_kill?.checked_sub(c.before.oom_kill?)?;
                (rise > 0).then_some((c.after_ns, c.at_ns, rise))
            })
            .collect()
    }
}

/// Keeps the OOM killer off memprobe itself, where it may: writes -1000
/// to `/proc/self/oom_score_adj` (lowering it needs `CAP_SYS_RESOURCE`;
/// without it nothing changes). Why: memprobe shares its container with the
/// command. When the kernel kills the command, the victim's memory is
/// released a moment later; an allocation of memprobe's in that moment would
/// find the container still full and, with the victim already dealt with,
/// memprobe the next process to kill, leaving the OOM kill unexplained.
/// Shielded, memprobe waits for the memory instead. Its own memory is
/// bounded (a timeline of at most 100 000 points).
///
/// Returns the value to give the command back (a child inherits the value
/// at fork; raising it back needs no privilege): `None` when nothing changed.
pub(crate) fn shield_self() -> Option<i32> {
    let before: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::fs::write("/proc/self/oom_score_adj", b"-1000").ok()?;
    Some(before)
}

/// How long an ended member is watched for its zombie state.
const ZOMBIE_WATCH_NS: u64 = 2_000_000_000;

/// Catches how members that are not memprobe's child ended. A sample sees
/// a process end when it releases its memory, a moment before it becomes a
/// zombie; its parent then reaps it, at once or at its next poll. So a
/// member ended without a wait status is looked at again at every tick
/// until it is a zombie (its status read), gone (reaped), or 2 s passed.
#[derive(Debug, Default)]
pub(crate) struct ZombieWatch {
    pending: Vec<(u32, u64)>,
}

impl ZombieWatch {
    /// `pid` was seen ended at `now`: its wait status if it is a zombie
    /// already, else it is watched.
    pub(crate) fn ended(&mut self, pid: u32, now: u64) -> Option<i32> {
        let status = memprobe_core::process::zombie_wait_status(pid);
        if status.is_none() && self.pending.len() < MAX_CHANGES {
            self.pending.push((pid, now));
        }
        status
    }

    /// Looks at the watched members again at `now`: those caught as
    /// zombies, with their wait status.
    pub(crate) fn tick(&mut self, now: u64) -> Vec<(u32, i32)> {
        let mut caught = Vec::new();
        self.pending.retain(|&(pid, since)| {
            if let Some(s) = memprobe_core::process::zombie_wait_status(pid) {
                caught.push((pid, s));
                return false;
            }
            now.saturating_sub(since) < ZOMBIE_WATCH_NS
                && std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        caught
    }
}

/// One process of the tree, as the detector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) pid: u32,
    pub(crate) ppid: Option<u32>,
    pub(crate) name: String,
    /// The last sample that saw it alive, ns since the start (`None`: no
    /// sample saw it; it is known from the kernel's process events or as an
    /// orphan memprobe reaped).
    pub(crate) last_seen_ns: Option<u64>,
    /// When it was born, where the kernel's process events said so.
    pub(crate) born_ns: Option<u64>,
    /// When it was seen ended (the direct child: when it terminated).
    pub(crate) ended_ns: Option<u64>,
    /// How it ended, in `waitpid`'s encoding, where that was seen.
    pub(crate) wait_status: Option<i32>,
    /// The last RSS sampled (0 when no sample saw it).
    pub(crate) last_rss: u64,
    /// The direct child's exact peak (`ru_maxrss` of the command alone);
    /// `None` for others.
    pub(crate) exact_peak: Option<u64>,
    pub(crate) direct_child: bool,
}

impl Member {
    fn signal(&self) -> Option<i32> {
        let s = self.wait_status?;
        libc::WIFSIGNALED(s).then(|| libc::WTERMSIG(s))
    }

    /// Ended of something other than `SIGKILL`, as far as was seen.
    fn ended_otherwise(&self) -> bool {
        self.wait_status.is_some() && self.signal() != Some(libc::SIGKILL)
    }

    /// Whether it is the process the kernel's record names: the same pid,
    /// the same name (the kernel's 15 bytes, or a name seen before an
    /// exec), alive at the kill (within `slack` of the record's time).
    fn is(&self, k: &KernelKill, slack: u64) -> bool {
        let names_agree = self.name.is_empty()
            || self.name == k.name
            || (self.name.len() >= 15 && k.name.starts_with(&self.name[..15]))
            || (k.name.len() >= 15 && self.name.starts_with(&k.name));
        let born_before = self
            .born_ns
            .map_or(true, |b| b <= k.at_ns.saturating_add(slack));
        let ended_after = self
            .ended_ns
            .map_or(true, |e| e.saturating_add(slack) >= k.at_ns);
        self.pid == k.pid && names_agree && born_before && ended_after
    }
}

/// The container's figures the verdict quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Container {
    pub(crate) limit: Option<u64>,
    pub(crate) peak: Option<u64>,
    pub(crate) peak_exact: bool,
}

impl Container {
    /// At or within 5% (at least 16 MiB) of its limit.
    fn near_limit(&self) -> bool {
        match (self.limit, self.peak) {
            (Some(limit), Some(peak)) => {
                let slack = (limit / 20).max(16 << 20);
                peak.saturating_add(slack) >= limit
            }
            _ => false,
        }
    }
}

/// One OOM kill in the kernel's log, on the run's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelKill {
    pub(crate) pid: u32,
    pub(crate) name: String,
    /// ns since the start (the kernel's clock is close to
    /// `CLOCK_MONOTONIC`; 0 when the record came before the start).
    pub(crate) at_ns: u64,
    pub(crate) rss_bytes: Option<u64>,
    pub(crate) memcg: Option<String>,
}

/// The kernel's log as evidence: the kills it named, or why it was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KernelRecord {
    Read {
        kills: Vec<KernelKill>,
        /// Records overwritten before memprobe read them.
        lost: u64,
    },
    Unreadable(String),
}

impl KernelRecord {
    /// The kernel's log read in full: every OOM kill during the run named.
    fn complete(&self) -> Option<&[KernelKill]> {
        match self {
            KernelRecord::Read { kills, lost: 0 } => Some(kills),
            _ => None,
        }
    }
}

/// Everything the detector looks at.
#[derive(Debug, Clone)]
pub(crate) struct Inputs<'a> {
    pub(crate) counters: &'a CounterLog,
    /// The tree's members, the direct child among them.
    pub(crate) members: &'a [Member],
    pub(crate) container: Option<Container>,
    /// The sampling interval, ns.
    pub(crate) interval_ns: u64,
    /// `CLOCK_MONOTONIC` at the start, ns: times given to the phase lookup
    /// are absolute.
    pub(crate) t0_monotonic_ns: u64,
    /// The OOM kills the kernel logged, or why its log was not read.
    pub(crate) kernel: KernelRecord,
    /// How births and deaths were tracked: `Ok(())` with the kernel's
    /// process events, every one seen; `Err(why)` where samples (and the
    /// orphans memprobe reaps) were all there was.
    pub(crate) tracking: Result<(), String>,
}

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

/// The verdict. `phase_at(pid, t)`: the training phase open in process
/// `pid` (or any process of the run, with `None`) at `t` ns on
/// `CLOCK_MONOTONIC`.
pub(crate) fn detect(
    inputs: &Inputs,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) -> OomKillReport {
    let counters = inputs.counters;
    let has_counter = counters.has_oom_kill();
    let counted: u64 = counters.kills().iter().map(|k| k.2).sum();
    // (member, evidence, sigkill seen)
    let mut matched: Vec<(&Member, Evidence, bool)> = Vec::new();
    let mut other_kills = Vec::new();
    let mut level;
    if let Some(kills) = inputs.kernel.complete() {
        // The kernel's record names every victim: nothing is guessed.
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
        level = if matched.is_empty() {
            Level::None
        } else {
            Level::Confirmed
        };
    } else {
        // The counter says that a process was killed, not which: a death
        // at that time makes it likely, never confirmed.
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
                            && m.last_seen_ns.or(m.born_ns).unwrap_or(after)
                                < at.saturating_add(delay)
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
        level = if !matched.is_empty() {
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
    }
    matched.sort_by_key(|(m, e, seen)| {
        (
            *e != Evidence::KernelLog,
            std::cmp::Reverse(*seen),
            std::cmp::Reverse(peak(m, inputs).0.unwrap_or(0)),
        )
    });
    let victims: Vec<VictimReport> = matched
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
        .collect();
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
    let mut report = OomKillReport {
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
    };
    report.explanation = explain(&report, inputs);
    report
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

/// Runs the detector over a finished run (the child reaped, its `ru_maxrss`
/// folded in) and keeps the verdict in `rec.oom_kill`. `t0_monotonic_ns`:
/// `CLOCK_MONOTONIC` when the child was spawned; `lives`: what the kernel's
/// process events saw (or why they were not read); `kernel`: the kernel's
/// log of OOM kills.
pub(crate) fn explain_run(
    rec: &mut Recording,
    facts: &RunFacts,
    t0_monotonic_ns: u64,
    lives: Result<&crate::commands::run::process_events::Lifetimes, String>,
    kernel: &crate::commands::run::kernel_log::KernelLog,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) {
    let end = (facts.duration_s * 1e9) as u64;
    let rel = |mono: u64| mono.saturating_sub(t0_monotonic_ns);
    let child_status = match (facts.exit.code, facts.exit.signal) {
        (Some(c), _) => Some((c & 0xff) << 8),
        (None, Some(s)) => Some(s & 0x7f),
        _ => None,
    };
    let mut members: Vec<Member> = rec
        .processes
        .iter()
        .map(|p| {
            let direct = p.pid == facts.pid;
            Member {
                pid: p.pid,
                ppid: p.ppid,
                name: p.name.clone(),
                last_seen_ns: Some(p.last_seen_ns).filter(|_| p.vmhwm.is_some()),
                born_ns: None,
                ended_ns: if direct { Some(end) } else { p.ended_ns },
                wait_status: if direct { child_status } else { p.wait_status },
                last_rss: p.last_rss,
                // Exact where ru_maxrss is the command's own (it had no
                // children whose peaks the kernel folds in).
                exact_peak: (direct && p.rusage_children != Some(true)).then(|| p.peak().0),
                direct_child: direct,
            }
        })
        .collect();
    // Orphans memprobe reaped: how a member samples saw ended. One no
    // sample saw may be an orphan of a process memprobe's own shell
    // started before it, not of the run: it is no member on that alone.
    for o in &rec.orphans {
        if let Some(m) = members.iter_mut().find(|m| m.pid == o.pid) {
            m.wait_status = m.wait_status.or(Some(o.wait_status));
            m.ended_ns = m.ended_ns.or(Some(o.ended_ns));
        }
    }
    let tracking = match lives {
        Ok(l) => {
            for life in l.members.values() {
                match members.iter_mut().find(|m| m.pid == life.pid) {
                    // The events' death is exact, and its status is seen.
                    Some(m) => {
                        m.born_ns = Some(rel(life.born_ns));
                        if !m.direct_child {
                            m.ended_ns = life.ended_ns.map(rel).or(m.ended_ns);
                            m.wait_status = life.wait_status.or(m.wait_status);
                        }
                        m.ppid = m.ppid.or(Some(life.ppid));
                    }
                    None => members.push(Member {
                        pid: life.pid,
                        ppid: Some(life.ppid),
                        name: life.name.clone(),
                        last_seen_ns: None,
                        born_ns: Some(rel(life.born_ns)),
                        ended_ns: life.ended_ns.map(rel),
                        wait_status: life.wait_status,
                        last_rss: 0,
                        exact_peak: None,
                        direct_child: life.pid == facts.pid,
                    }),
                }
            }
            if l.complete() {
                Ok(())
            } else {
                Err(format!(
                    "the kernel's process events overflowed {} time(s): some births and deaths were not seen",
                    l.overflows + l.dropped
                ))
            }
        }
        Err(why) => Err(why),
    };
    let kernel = if kernel.readable() {
        KernelRecord::Read {
            kills: kernel
                .kills()
                .iter()
                .map(|k| KernelKill {
                    pid: k.pid,
                    name: k.name.clone(),
                    at_ns: rel(k.at_us.saturating_mul(1000)),
                    rss_bytes: k.rss_bytes,
                    memcg: k.memcg.clone(),
                })
                .collect(),
            lost: kernel.lost(),
        }
    } else {
        KernelRecord::Unreadable(kernel.why_not().unwrap_or("not read").to_string())
    };
    let container = rec.cgroup.as_ref().map(|c| Container {
        limit: c.limit,
        peak: c.exact_peak.or(c.sampled_peak.map(|(v, _)| v)),
        peak_exact: c.exact_peak.is_some(),
    });
    let inputs = Inputs {
        counters: &rec.oom_counters,
        members: &members,
        container,
        interval_ns: u64::try_from(facts.interval.as_nanos()).unwrap_or(u64::MAX),
        t0_monotonic_ns,
        kernel,
        tracking,
    };
    let report = detect(&inputs, phase_at);
    rec.oom_kill = Some(report);
}

/// Seconds into the run, always in seconds (a log's timestamps are
/// compared with it): `5.02 s`, `812.3 s`.
fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.1} s")
    }
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

/// "pid 4242 (grow)", or several, for the explanation.
fn named(kills: &[OtherKill]) -> String {
    let mut names: Vec<String> = kills
        .iter()
        .take(3)
        .map(|k| format!("pid {} ({})", k.pid, k.name))
        .collect();
    if kills.len() > 3 {
        names.push(format!("{} more", kills.len() - 3));
    }
    names.join(", ")
}

/// The summary's paragraph.
fn explain(r: &OomKillReport, inputs: &Inputs) -> Option<String> {
    let container = inputs.container.and_then(|c| {
        let peak = c.peak?;
        let how = if c.peak_exact { "" } else { " (sampled)" };
        Some(match c.limit {
            Some(limit) => format!(
                "the container peaked at {}{how} of its {} limit",
                units::bytes(peak),
                units::bytes(limit)
            ),
            None => format!(
                "the container peaked at {}{how} (no limit set)",
                units::bytes(peak)
            ),
        })
    });
    let no_log = r
        .kernel_log_unavailable
        .as_deref()
        .map(|why| format!("the kernel's log, which names each victim, was not read: {why}"));
    let Some(v) = r.victims.first() else {
        // Nothing of the run's: say why a SIGKILL was not the kernel's, and
        // whether the kernel killed something else in the container.
        let sigkilled = inputs
            .members
            .iter()
            .find(|m| m.direct_child && m.signal() == Some(libc::SIGKILL))
            .or_else(|| {
                inputs
                    .members
                    .iter()
                    .find(|m| m.signal() == Some(libc::SIGKILL))
            });
        let outside = r.kills_outside_tree.filter(|&n| n > 0);
        let plural = |n: u64| if n == 1 { "" } else { "es" };
        return match (r.verdict, sigkilled, outside) {
            (Level::None, Some(m), _) if r.kernel_log && !r.other_kills.is_empty() => Some(format!(
                "pid {} ({}) was killed by SIGKILL, but not by the kernel's OOM killer: the kernel's log names {} as its victim{}, not a process of this run",
                m.pid,
                m.name,
                named(&r.other_kills),
                if r.other_kills.len() == 1 { "" } else { "s" }
            )),
            (Level::None, Some(m), _) if r.kernel_log => Some(format!(
                "pid {} ({}) was killed by SIGKILL, but not by the kernel's OOM killer: the kernel's log records no OOM kill of it (a process sent it: a user-space OOM daemon, a scheduler, or the program itself)",
                m.pid, m.name
            )),
            (Level::None, _, Some(n)) if r.kernel_log => Some(format!(
                "the kernel's OOM killer killed {n} process{} in the container during the run, none of them this run's (the kernel's log names {})",
                plural(n),
                named(&r.other_kills)
            )),
            (Level::None, _, Some(n)) => Some(format!(
                "the kernel's OOM killer killed {n} process{} in the container during the run, none of them this run's (the container's oom_kill counter rose; no process of the run ended then, and every birth and death of the run was seen)",
                plural(n)
            )),
            (Level::None, Some(m), None) if r.oom_kill_rise.is_some() => Some(format!(
                "pid {} ({}) was killed by SIGKILL, but not by the kernel's OOM killer: the container's oom_kill counter did not rise (a process sent it: a user-space OOM daemon, a scheduler, or the program itself)",
                m.pid, m.name
            )),
            (Level::Unknown, _, _) if r.oom_kill_rise.is_some_and(|n| n > 0) => {
                let n = r.oom_kill_rise.unwrap_or(0);
                Some(format!(
                    "unknown whether the kernel's OOM killer killed a process of this run: the container's oom_kill counter rose by {n} while no process of the run that memprobe saw ended, but a process living between two samples is not seen ({}); {}",
                    r.tracking_unavailable.as_deref().unwrap_or("births and deaths not tracked"),
                    no_log.as_deref().unwrap_or("the kernel's log was incomplete")
                ))
            }
            (Level::Unknown, Some(m), _) => Some(format!(
                "pid {} ({}) was killed by SIGKILL; whether by the kernel's OOM killer is unknown: the container's OOM counters could not be read{}",
                m.pid,
                m.name,
                no_log.as_deref().map(|t| format!(", and {t}")).unwrap_or_default()
            )),
            _ => None,
        };
    };
    let phase = match (&v.phase, v.phase_pid) {
        (Some(p), Some(pid)) if pid == v.pid => format!(", in {p}"),
        (Some(p), Some(pid)) => {
            let whose = inputs.members.iter().find(|m| m.pid == pid).map_or_else(
                || format!("pid {pid}"),
                |m| format!("pid {pid} ({})", m.name),
            );
            format!(", in {p} ({whose}'s phase: it sent none of its own)")
        }
        (Some(p), None) => format!(", in {p} (the run's phase: it sent none of its own)"),
        (None, _) => String::new(),
    };
    let peak = match (v.peak_source, v.peak_bytes) {
        ("rusage", Some(b)) => format!("its peak RSS {} (exact)", units::bytes(b)),
        ("last_rss", Some(b)) => format!("its last RSS seen {} (sampled)", units::bytes(b)),
        ("kernel_log", Some(b)) => format!(
            "its RSS when killed {} (the kernel's record; no sample saw it)",
            units::bytes(b)
        ),
        _ => "its memory was not measured (no sample saw it)".to_string(),
    };
    let more = match r.victims.len() {
        1 => String::new(),
        n => format!(" ({} more of the run's processes with it)", n - 1),
    };
    let at = seconds(v.at_s);
    let who = format!("pid {} ({})", v.pid, v.name);
    let head = match v.evidence {
        Evidence::KernelLog => format!(
            "the kernel's OOM killer killed {who} {at} into the run{phase}{more}"
        ),
        Evidence::CounterAndSigkill => format!(
            "the kernel's OOM killer likely killed {who} {at} into the run{phase}{more}: it died of SIGKILL as the container's oom_kill counter rose, but the counter does not say which process was killed ({})",
            no_log.as_deref().unwrap_or("the kernel's log was incomplete")
        ),
        Evidence::CounterAndEnd => format!(
            "the kernel's OOM killer most likely killed {who} {at} into the run{phase}{more}: the container's oom_kill counter rose as it ended (how it ended was not seen: its parent reaped it first)"
        ),
        Evidence::SigkillAtLimit => format!(
            "{who} was most likely killed by the kernel's OOM killer {at} into the run{phase}: it died of SIGKILL with the container at its limit (this machine keeps no OOM-kill counter to confirm it)"
        ),
    };
    let evidence = if v.evidence == Evidence::KernelLog {
        " The kernel's log names it."
    } else {
        ""
    };
    Some(match container {
        Some(c) => format!("{head}; {peak}; {c}.{evidence}"),
        None => format!("{head}; {peak}.{evidence}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const GIB: u64 = 1 << 30;

    /// Feeds a log with (time, file text) readings as the kernel writes them.
    fn log(version: CgroupVersion, readings: &[(u64, &str)]) -> CounterLog {
        let mut l = CounterLog::new(version);
        for &(t, text) in readings {
            l.observe(t, OomEvents::parse(version, text.as_bytes()));
        }
        l
    }

    fn v2(oom: u64, kill: u64) -> String {
        format!(
            "low 0\nhigh 0\nmax {}\noom {oom}\noom_kill {kill}\noom_group_kill 0\n",
            oom * 3
        )
    }

    fn v1(kill: u64) -> String {
        format!("oom_kill_disable 0\nunder_oom 0\noom_kill {kill}\n")
    }

    fn member(pid: u32, name: &str, seen: u64, ended: Option<u64>, status: Option<i32>) -> Member {
        Member {
            pid,
            ppid: Some(4242),
            name: name.into(),
            last_seen_ns: Some(seen),
            born_ns: None,
            ended_ns: ended,
            wait_status: status,
            last_rss: 2 * GIB,
            exact_peak: None,
            direct_child: false,
        }
    }

    /// The direct child, killed (or not) at `end`.
    fn child(end: u64, status: i32) -> Member {
        Member {
            pid: 4242,
            ppid: Some(1),
            name: "python".into(),
            last_seen_ns: Some(end - 10 * MS),
            born_ns: None,
            ended_ns: Some(end),
            wait_status: Some(status),
            last_rss: 7 * GIB,
            exact_peak: Some(8_386_000_000),
            direct_child: true,
        }
    }

    const SIGKILLED: i32 = libc::SIGKILL;
    const EXIT_0: i32 = 0;
    const EXIT_1: i32 = 1 << 8;

    fn container() -> Option<Container> {
        Some(Container {
            limit: Some(8 * GIB),
            peak: Some(8_580_000_000),
            peak_exact: true,
        })
    }

    fn inputs<'a>(counters: &'a CounterLog, members: &'a [Member]) -> Inputs<'a> {
        Inputs {
            counters,
            members,
            container: container(),
            interval_ns: 10 * MS,
            t0_monotonic_ns: 1_000 * S,
            kernel: KernelRecord::Unreadable("/dev/kmsg: permission denied".into()),
            tracking: Err("no process events".into()),
        }
    }

    /// The kernel's log read, naming these kills (pid, name, at).
    fn logged(kills: &[(u32, &str, u64)]) -> KernelRecord {
        KernelRecord::Read {
            kills: kills
                .iter()
                .map(|&(pid, name, at_ns)| KernelKill {
                    pid,
                    name: name.into(),
                    at_ns,
                    rss_bytes: Some(100 << 20),
                    memcg: Some("/test".into()),
                })
                .collect(),
            lost: 0,
        }
    }

    fn no_phase(_: Option<u32>, _: u64) -> Option<String> {
        None
    }

    #[test]
    fn v2_counter_rises_and_the_child_dies_of_sigkill_confirmed() {
        let text = (v2(0, 0), v2(1, 1));
        let l = log(
            CgroupVersion::V2,
            &[
                (0, &text.0),
                (812 * S, &text.0),
                (812 * S + 10 * MS, &text.1),
            ],
        );
        let members = [child(812 * S + 12 * MS, SIGKILLED)];
        // The phase lookup gets the victim's pid and the absolute time.
        let phase = |pid: Option<u32>, t: u64| {
            assert_eq!(pid, Some(4242));
            assert_eq!(t, 1_000 * S + 812 * S + 12 * MS);
            Some("epoch 3 / step 120".to_string())
        };
        // The kernel's log names it: confirmed.
        let mut with_log = inputs(&l, &members);
        with_log.kernel = logged(&[(4242, "python", 812 * S + 10 * MS)]);
        let r = detect(&with_log, &phase);
        assert_eq!(r.verdict, Level::Confirmed);
        assert_eq!(r.victims[0].evidence, Evidence::KernelLog);
        assert_eq!(r.victims[0].phase_pid, Some(4242));
        assert_eq!(r.counters, Some("memory.events (cgroup v2)"));
        assert_eq!((r.oom_kill_rise, r.oom_rise), (Some(1), Some(1)));
        assert_eq!(r.kills_outside_tree, Some(0));
        let v = &r.victims[0];
        assert_eq!(
            (v.pid, v.peak_source, v.sigkill_seen),
            (4242, "rusage", true)
        );
        assert_eq!(
            r.explanation.as_deref(),
            Some(
                "the kernel's OOM killer killed pid 4242 (python) 812.0 s into the run, in epoch 3 / step 120; \
                 its peak RSS 7.81 GiB (exact); the container peaked at 7.99 GiB of its 8.00 GiB limit. \
                 The kernel's log names it."
            )
        );
        // Without the log, the same counter and SIGKILL are only likely,
        // and the paragraph says why.
        let r = detect(&inputs(&l, &members), &phase);
        assert_eq!(r.verdict, Level::Likely);
        assert_eq!(r.victims[0].evidence, Evidence::CounterAndSigkill);
        let text = r.explanation.unwrap();
        assert!(
            text.starts_with("the kernel's OOM killer likely killed pid 4242 (python)"),
            "{text}"
        );
        assert!(text.contains("does not say which process"), "{text}");
        assert!(text.contains("/dev/kmsg: permission denied"), "{text}");
    }

    #[test]
    fn v1_counter_rises_for_a_worker_caught_as_a_zombie_confirmed() {
        let l = log(
            CgroupVersion::V1,
            &[(0, &v1(0)), (5 * S, &v1(0)), (5 * S + 10 * MS, &v1(1))],
        );
        let members = [
            child(9 * S, EXIT_1),
            member(
                4250,
                "pt_data_worker",
                5 * S,
                Some(5 * S + 20 * MS),
                Some(SIGKILLED),
            ),
            member(4251, "pt_data_worker", 9 * S, Some(9 * S), Some(EXIT_0)),
        ];
        let mut with_log = inputs(&l, &members);
        with_log.kernel = logged(&[(4250, "pt_data_worker", 5 * S + 10 * MS)]);
        let r = detect(&with_log, &no_phase);
        assert_eq!(r.verdict, Level::Confirmed);
        assert_eq!(r.counters, Some("memory.oom_control (cgroup v1)"));
        assert_eq!(r.victims.len(), 1);
        let v = &r.victims[0];
        assert_eq!(
            (v.pid, v.peak_source, v.direct_child),
            (4250, "last_rss", false)
        );
        let text = r.explanation.unwrap();
        assert!(
            text.starts_with(
                "the kernel's OOM killer killed pid 4250 (pt_data_worker) 5.02 s into the run;"
            ),
            "{text}"
        );
        assert!(
            text.contains("its last RSS seen 2.00 GiB (sampled);"),
            "{text}"
        );
    }

    #[test]
    fn a_rise_as_a_member_vanishes_unseen_is_likely() {
        let l = log(CgroupVersion::V2, &[(0, &v2(0, 0)), (S, &v2(1, 1))]);
        // Reaped by its parent before any sample saw how it ended.
        let members = [
            child(3 * S, EXIT_0),
            member(7, "worker", S - 10 * MS, Some(S), None),
        ];
        let r = detect(&inputs(&l, &members), &no_phase);
        assert_eq!(r.verdict, Level::Likely);
        assert_eq!(r.victims[0].pid, 7);
        assert!(!r.victims[0].sigkill_seen);
        assert!(r
            .explanation
            .unwrap()
            .contains("most likely killed pid 7 (worker)"));
    }

    #[test]
    fn sigkill_without_a_rise_is_not_an_oom_kill() {
        // Counters readable, nonzero from before the run, never rising: the
        // program's own SIGKILL (or a scheduler's).
        for (version, text) in [(CgroupVersion::V2, v2(4, 2)), (CgroupVersion::V1, v1(2))] {
            let l = log(version, &[(0, &text), (S, &text), (2 * S, &text)]);
            let members = [child(2 * S, SIGKILLED)];
            let r = detect(&inputs(&l, &members), &no_phase);
            assert_eq!(r.verdict, Level::None, "{version:?}");
            assert!(r.victims.is_empty());
            assert_eq!(r.oom_kill_rise, Some(0));
            let text = r.explanation.unwrap();
            assert!(
                text.contains("but not by the kernel's OOM killer"),
                "{text}"
            );
        }
    }

    #[test]
    fn counters_already_nonzero_at_start_are_the_baseline() {
        let l = log(
            CgroupVersion::V2,
            &[(0, &v2(7, 5)), (S, &v2(7, 5)), (S + 10 * MS, &v2(8, 6))],
        );
        let members = [child(S + 15 * MS, SIGKILLED)];
        let r = detect(&inputs(&l, &members), &no_phase);
        assert_eq!(r.verdict, Level::Likely);
        assert_eq!(r.oom_kill_rise, Some(1));
        assert_eq!(r.kills_outside_tree, Some(0));
    }

    #[test]
    fn a_rise_for_a_process_outside_the_tree_names_nobody_of_the_run() {
        let l = log(
            CgroupVersion::V2,
            &[(0, &v2(0, 0)), (S, &v2(0, 0)), (S + 10 * MS, &v2(1, 1))],
        );
        // The run's processes all end normally, long after.
        let members = [
            child(10 * S, EXIT_0),
            member(9, "worker", 10 * S, Some(10 * S), Some(EXIT_0)),
        ];
        // Every birth and death seen (the kernel's process events): none.
        let mut tracked = inputs(&l, &members);
        tracked.tracking = Ok(());
        let r = detect(&tracked, &no_phase);
        assert_eq!(r.verdict, Level::None);
        assert_eq!(r.kills_outside_tree, Some(1));
        assert!(r.victims.is_empty());
        assert!(r.explanation.unwrap().contains("none of them this run's"));
        // By samples alone, a worker living between two samples could have
        // been it: unknown, not "none of them this run's".
        let r = detect(&inputs(&l, &members), &no_phase);
        assert_eq!(r.verdict, Level::Unknown);
        assert_eq!(r.kills_outside_tree, None);
        let text = r.explanation.unwrap();
        assert!(!text.contains("none of them this run's"), "{text}");
        assert!(text.contains("between two samples"), "{text}");
        // A member that exited normally at that very time is not the victim.
        let members = [
            child(10 * S, EXIT_0),
            member(9, "worker", S, Some(S + 10 * MS), Some(EXIT_0)),
        ];
        let mut tracked = inputs(&l, &members);
        tracked.tracking = Ok(());
        assert_eq!(detect(&tracked, &no_phase).verdict, Level::None);
    }

    /// Item 7 as recorded: an unrelated process of the container is
    /// OOM-killed at 1.0 s; at 1.5 s the user kill -9s the command. The
    /// time window fits; only the kernel's log tells.
    #[test]
    fn an_unrelated_kill_then_the_users_kill_is_never_confirmed() {
        let l = log(
            CgroupVersion::V2,
            &[(0, &v2(0, 0)), (S, &v2(0, 0)), (S + 10 * MS, &v2(1, 1))],
        );
        let mut grow = child(S + 500 * MS, SIGKILLED);
        grow.name = "grow".into();
        grow.exact_peak = Some(28_000_000);
        let members = [grow];
        // The log names the other process: none, and it says so.
        let mut with_log = inputs(&l, &members);
        with_log.kernel = logged(&[(777, "grow", S + 5 * MS)]);
        let r = detect(&with_log, &no_phase);
        assert_eq!(r.verdict, Level::None);
        assert!(r.victims.is_empty());
        assert_eq!(r.kills_outside_tree, Some(1));
        assert_eq!(r.other_kills.len(), 1);
        assert_eq!(r.other_kills[0].pid, 777);
        let text = r.explanation.unwrap();
        assert!(
            text.starts_with("pid 4242 (grow) was killed by SIGKILL, but not by the kernel's OOM killer: the kernel's log names pid 777 (grow)"),
            "{text}"
        );
        // The same name, another pid: still not the command.
        // Without the log: likely at most, with why.
        let r = detect(&inputs(&l, &members), &no_phase);
        assert_eq!(r.verdict, Level::Likely);
        assert_ne!(r.verdict, Level::Confirmed);
        assert!(r
            .explanation
            .unwrap()
            .contains("does not say which process"));
    }

    /// Item 8 as recorded: with a 1 s interval, a worker is born at 1.2 s
    /// and OOM-killed at 1.6 s, between two samples; no sample saw it. The
    /// kernel's process events saw it born and killed, its log names it.
    #[test]
    fn a_worker_living_between_two_samples_is_found() {
        let l = log(
            CgroupVersion::V1,
            &[(0, &v1(0)), (S, &v1(0)), (2 * S, &v1(1))],
        );
        let mut worker = member(5001, "worker", 0, Some(S + 600 * MS), Some(SIGKILLED));
        worker.last_seen_ns = None;
        worker.last_rss = 0;
        worker.born_ns = Some(S + 200 * MS);
        let members = [child(3 * S, EXIT_1), worker];
        let mut i = inputs(&l, &members);
        i.interval_ns = S;
        i.tracking = Ok(());
        i.kernel = logged(&[(5001, "worker", S + 590 * MS)]);
        let r = detect(&i, &no_phase);
        assert_eq!(r.verdict, Level::Confirmed);
        let v = &r.victims[0];
        assert_eq!((v.pid, v.peak_source), (5001, "kernel_log"));
        assert_eq!(v.peak_bytes, Some(100 << 20));
        assert!(r
            .explanation
            .unwrap()
            .contains("the kernel's record; no sample saw it"));
        // Without the log: the events' SIGKILL and the counter make it likely.
        i.kernel = KernelRecord::Unreadable("no".into());
        let r = detect(&i, &no_phase);
        assert_eq!(r.verdict, Level::Likely);
        assert_eq!(r.victims[0].pid, 5001);
        assert_eq!(r.victims[0].peak_source, "none");
        assert_eq!(r.victims[0].peak_bytes, None);
    }

    /// A worker sends no phases; its trainer does: the verdict carries the
    /// trainer's phase and says whose it is.
    #[test]
    fn a_workers_phase_is_its_trainers() {
        let l = log(CgroupVersion::V2, &[(0, &v2(0, 0)), (S, &v2(1, 1))]);
        let members = [
            child(3 * S, EXIT_1),
            member(
                4250,
                "pt_data_worker",
                S - 10 * MS,
                Some(S + 5 * MS),
                Some(SIGKILLED),
            ),
        ];
        let mut i = inputs(&l, &members);
        i.kernel = logged(&[(4250, "pt_data_worker", S)]);
        let phase = |pid: Option<u32>, _t: u64| match pid {
            Some(4242) => Some("epoch 1 / step 7".to_string()),
            _ => None,
        };
        let r = detect(&i, &phase);
        let v = &r.victims[0];
        assert_eq!(v.phase.as_deref(), Some("epoch 1 / step 7"));
        assert_eq!(v.phase_pid, Some(4242));
        let text = r.explanation.unwrap();
        assert!(
            text.contains(
                "in epoch 1 / step 7 (pid 4242 (python)'s phase: it sent none of its own)"
            ),
            "{text}"
        );
        // No ancestor sent any: the run's, whoever sent it.
        let any = |pid: Option<u32>, _t: u64| pid.is_none().then(|| "epoch 2".to_string());
        let r = detect(&i, &any);
        assert_eq!(r.victims[0].phase.as_deref(), Some("epoch 2"));
        assert_eq!(r.victims[0].phase_pid, None);
    }

    /// No counter and no log: a SIGKILL far from the limit is unknown, not
    /// "none".
    #[test]
    fn nothing_to_tell_by_is_unknown() {
        let none = CounterLog::default();
        let members = [child(S, SIGKILLED)];
        let mut bare = inputs(&none, &members);
        bare.container = None;
        let r = detect(&bare, &no_phase);
        assert_eq!(r.verdict, Level::Unknown);
        let text = r.explanation.unwrap();
        assert!(
            text.contains("whether by the kernel's OOM killer is unknown"),
            "{text}"
        );
        // A clean exit: unknown still, with nothing to say.
        let members = [child(S, EXIT_0)];
        let mut bare = inputs(&none, &members);
        bare.container = None;
        let r = detect(&bare, &no_phase);
        assert_eq!((r.verdict, r.explanation), (Level::Unknown, None));
    }

    #[test]
    fn sigkill_at_the_limit_without_any_counter_is_likely() {
        // An old v1 kernel: under_oom but no oom_kill line.
        let old = "oom_kill_disable 0\nunder_oom 0\n";
        let l = log(CgroupVersion::V1, &[(0, old), (S, old)]);
        let members = [child(S, SIGKILLED)];
        let r = detect(&inputs(&l, &members), &no_phase);
        assert_eq!(r.verdict, Level::Likely);
        assert_eq!(r.oom_kill_rise, None);
        assert_eq!(r.kills_outside_tree, None);
        let text = r.explanation.unwrap();
        assert!(text.contains("no OOM-kill counter"), "{text}");
        // Far from the limit: no claim.
        let mut far = inputs(&l, &members);
        far.container = Some(Container {
            limit: Some(8 * GIB),
            peak: Some(GIB),
            peak_exact: false,
        });
        // Far from the limit: no claim either way (no counter, no log).
        assert_eq!(detect(&far, &no_phase).verdict, Level::Unknown);
        // No cgroup at all: no counter and no limit, no claim.
        let none = CounterLog::default();
        let mut bare = inputs(&none, &members);
        bare.container = None;
        let r = detect(&bare, &no_phase);
        assert_eq!((r.verdict, r.counters), (Level::Unknown, None));
    }

    #[test]
    fn a_group_kill_names_the_largest_first_and_counts_the_rest() {
        let before = "oom 0\noom_kill 0\noom_group_kill 0\nmax 0\n";
        let after = "oom 1\noom_kill 3\noom_group_kill 1\nmax 9\n";
        let l = log(CgroupVersion::V2, &[(0, before), (S, after)]);
        let mut small = member(20, "worker", S - 10 * MS, Some(S + 5 * MS), Some(SIGKILLED));
        small.last_rss = GIB / 2;
        let members = [
            child(S + 10 * MS, SIGKILLED),
            small,
            member(21, "worker", S - 10 * MS, Some(S + 5 * MS), Some(SIGKILLED)),
        ];
        let mut i = inputs(&l, &members);
        i.kernel = logged(&[(20, "worker", S), (21, "worker", S), (4242, "python", S)]);
        let r = detect(&i, &no_phase);
        assert_eq!(r.verdict, Level::Confirmed);
        assert_eq!(r.oom_group_kill_rise, Some(1));
        let pids: Vec<u32> = r.victims.iter().map(|v| v.pid).collect();
        assert_eq!(pids, vec![4242, 21, 20]);
        assert!(r
            .explanation
            .unwrap()
            .contains("(2 more of the run's processes with it)"));
    }

    #[test]
    fn the_watch_catches_a_killed_process_as_a_zombie() {
        let mut kid = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let mut w = ZombieWatch::default();
        assert_eq!(w.ended(kid.id(), 0), None, "still running");
        kid.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let caught = loop {
            let c = w.tick(MS);
            if !c.is_empty() {
                break c;
            }
            assert!(std::time::Instant::now() < deadline, "never caught");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(caught, vec![(kid.id(), libc::SIGKILL)]);
        assert!(w.tick(2 * MS).is_empty(), "reported once");
        kid.wait().unwrap();
        // Watched no longer than 2 s.
        let mut other = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(w.ended(other.id(), 0), None);
        assert!(w.tick(3 * S).is_empty());
        assert!(w.pending.is_empty());
        other.kill().unwrap();
        other.wait().unwrap();
    }

    /// The JSON object agrees with the schema's `oom_kill`.
    #[test]
    fn the_report_agrees_with_the_schema() {
        let l = log(CgroupVersion::V2, &[(0, &v2(0, 0)), (S, &v2(1, 1))]);
        let members = [child(S + MS, SIGKILLED)];
        let root = crate::schema_check::load("docs/run-output.schema.json");
        let schema = serde_json::json!({ "$defs": root["$defs"], "$ref": "#/$defs/oom_kill" });
        let mut with_log = inputs(&l, &members);
        with_log.kernel = logged(&[(4242, "python", S), (9, "other", S)]);
        with_log.tracking = Ok(());
        let none = CounterLog::default();
        let mut bare = inputs(&none, &members);
        bare.container = None;
        for (i, verdict) in [
            (with_log, "confirmed"),
            (inputs(&l, &members), "likely"),
            (bare, "unknown"),
        ] {
            let doc = serde_json::to_value(detect(&i, &no_phase)).unwrap();
            let errors = crate::schema_check::check(&schema, &doc);
            assert!(errors.is_empty(), "{errors:#?}");
            assert_eq!(doc["verdict"], verdict);
        }
        let doc = serde_json::to_value(detect(&inputs(&l, &members), &no_phase)).unwrap();
        assert_eq!(doc["victims"][0]["peak_source"], "rusage");
    }

    #[test]
    fn the_log_keeps_the_first_reading_and_changes_only() {
        let mut l = CounterLog::new(CgroupVersion::V2);
        l.observe(0, None);
        assert_eq!(l.first, None);
        let e = |k| OomEvents {
            oom_kill: Some(k),
            ..OomEvents::default()
        };
        l.observe(10, Some(e(1)));
        l.observe(20, Some(e(1)));
        l.observe(30, None);
        l.observe(40, Some(e(2)));
        assert_eq!(l.first, Some((10, e(1))));
        assert_eq!(
            l.changes,
            vec![Change {
                after_ns: 20,
                at_ns: 40,
                before: e(1),
                now: e(2)
            }]
        );
        assert_eq!(l.rise(|e| e.oom_kill), Some(1));
    }
}
