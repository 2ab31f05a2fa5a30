//! Was the run's process killed by the kernel's OOM killer? A pure detector
//! over what the run recorded, and its verdict for the summary and the JSON.
//!
//! The evidence:
//! - the container's OOM event counters over time ([`CounterLog`]: cgroup
//!   v2 `memory.events`, v1 `memory.oom_control`), read by the sampling
//!   thread at every tick (one small `pread`). The kernel counts a kill in
//!   `oom_kill` before it sends the victim `SIGKILL`;
//! - the tree's members: when each was last seen alive with which RSS, when
//!   a sample first saw it ended, and its wait status when a sample caught it
//!   as a zombie (a member that is not memprobe's child is reaped by its own
//!   parent, often before any sample sees it);
//! - the direct child's wait status and `ru_maxrss` (its exact peak).
//!
//! Verdicts:
//! - **confirmed**: `oom_kill` rose, and a member died of `SIGKILL` at that
//!   time;
//! - **likely**: `oom_kill` rose and a member ended at that time, but how it
//!   ended was not seen (its parent reaped it between two samples); or a
//!   member died of `SIGKILL` with the container at or near its limit on a
//!   machine that keeps no `oom_kill` counter;
//! - **none**: anything else. A `SIGKILL` while the counter stayed put came
//!   from a process (a user-space OOM daemon, a scheduler, the program
//!   itself), not from the kernel; a rise with no member ending at that time
//!   killed a process outside the run's tree.

use crate::recording::Recording;
use crate::report::RunFacts;
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
    pub(crate) name: String,
    /// The last sample that saw it alive, ns since the start.
    pub(crate) last_seen_ns: u64,
    /// When it was seen ended (the direct child: when it terminated).
    pub(crate) ended_ns: Option<u64>,
    /// How it ended, in `waitpid`'s encoding, where that was seen.
    pub(crate) wait_status: Option<i32>,
    /// The last RSS sampled.
    pub(crate) last_rss: u64,
    /// The direct child's exact peak (`ru_maxrss`); `None` for others.
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
}

/// How sure the verdict is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    Confirmed,
    Likely,
    None,
}

/// `oom_kill.victims[]` in the JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct VictimReport {
    pub(crate) pid: u32,
    pub(crate) name: String,
    /// When it was seen ended, seconds since the start.
    pub(crate) at_s: f64,
    /// The training phase open at that time, where the program reports
    /// phases.
    pub(crate) phase: Option<String>,
    pub(crate) direct_child: bool,
    /// Whether its death by `SIGKILL` was seen (else it vanished).
    pub(crate) sigkill_seen: bool,
    pub(crate) peak_bytes: u64,
    /// `"rusage"`: the exact peak (`wait4`); `"last_rss"`: the last RSS
    /// sampled, for members that are not memprobe's child.
    pub(crate) peak_source: &'static str,
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
    /// Kills counted that match no member of the tree.
    pub(crate) kills_outside_tree: Option<u64>,
    /// The victims, the likeliest first.
    pub(crate) victims: Vec<VictimReport>,
    pub(crate) container_peak_bytes: Option<u64>,
    pub(crate) container_limit_bytes: Option<u64>,
    /// The summary's paragraph (without the `memprobe: ` prefix); null when
    /// there is nothing to say.
    pub(crate) explanation: Option<String>,
}

/// The verdict. `phase_at(pid, t)`: the training phase open in process
/// `pid` (or the program, with `None`) at `t` ns on `CLOCK_MONOTONIC`.
pub(crate) fn detect(
    inputs: &Inputs,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) -> OomKillReport {
    let counters = inputs.counters;
    let kills = counters.kills();
    let delay = DEATH_DELAY_NS.max(inputs.interval_ns.saturating_mul(5));
    // Members that ended in a window compatible with a counted kill: the
    // count comes first, then the death, within `delay`.
    let mut matched: Vec<(&Member, bool)> = Vec::new();
    let mut counted = 0u64;
    for &(after, at, rise) in &kills {
        counted += rise;
        let mut here: Vec<&Member> = inputs
            .members
            .iter()
            .filter(|m| !m.ended_otherwise())
            .filter(|m| !matched.iter().any(|(x, _)| x.pid == m.pid))
            .filter(|m| {
                m.ended_ns
                    .is_some_and(|end| after < end && m.last_seen_ns < at.saturating_add(delay))
            })
            .collect();
        // The OOM killer picks the largest: seen SIGKILLs first, then size.
        here.sort_by_key(|m| {
            (
                std::cmp::Reverse(m.signal() == Some(libc::SIGKILL)),
                std::cmp::Reverse(peak(m).0),
            )
        });
        for m in here
            .into_iter()
            .take(usize::try_from(rise).unwrap_or(usize::MAX))
        {
            matched.push((m, m.signal() == Some(libc::SIGKILL)));
        }
    }
    let has_counter = counters.has_oom_kill();
    let mut level = if matched.iter().any(|(_, seen)| *seen) {
        Level::Confirmed
    } else if !matched.is_empty() {
        Level::Likely
    } else {
        Level::None
    };
    // No counter to go by: a SIGKILL with the container at its limit.
    if !has_counter && level == Level::None {
        if let Some(m) = inputs
            .members
            .iter()
            .filter(|m| m.signal() == Some(libc::SIGKILL))
            .max_by_key(|m| peak(m).0)
        {
            if inputs.container.is_some_and(|c| c.near_limit()) {
                matched.push((m, true));
                level = Level::Likely;
            }
        }
    }
    matched.sort_by_key(|(m, seen)| (std::cmp::Reverse(*seen), std::cmp::Reverse(peak(m).0)));
    let victims: Vec<VictimReport> = matched
        .iter()
        .map(|(m, seen)| {
            let at = m.ended_ns.unwrap_or(m.last_seen_ns);
            let (bytes, source) = peak(m);
            VictimReport {
                pid: m.pid,
                name: m.name.clone(),
                at_s: at as f64 / 1e9,
                phase: phase_at(Some(m.pid), inputs.t0_monotonic_ns.saturating_add(at)),
                direct_child: m.direct_child,
                sigkill_seen: *seen,
                peak_bytes: bytes,
                peak_source: source,
            }
        })
        .collect();
    let matched_count = u64::try_from(matched.len()).unwrap_or(u64::MAX);
    let kills_outside_tree = has_counter.then(|| counted.saturating_sub(matched_count));
    let mut report = OomKillReport {
        verdict: level,
        counters: counters.first.and(counters.file),
        oom_kill_rise: counters.rise(|e| e.oom_kill),
        oom_rise: counters.rise(|e| e.oom),
        oom_group_kill_rise: counters.rise(|e| e.oom_group_kill),
        kills_outside_tree,
        victims,
        container_peak_bytes: inputs.container.and_then(|c| c.peak),
        container_limit_bytes: inputs.container.and_then(|c| c.limit),
        explanation: None,
    };
    report.explanation = explain(&report, inputs);
    report
}

/// Runs the detector over a finished run (the child reaped, its `ru_maxrss`
/// folded in) and keeps the verdict in `rec.oom_kill`. `t0_monotonic_ns`:
/// `CLOCK_MONOTONIC` when the child was spawned.
pub(crate) fn explain_run(
    rec: &mut Recording,
    facts: &RunFacts,
    t0_monotonic_ns: u64,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) {
    let end = (facts.duration_s * 1e9) as u64;
    let child_status = match (facts.exit.code, facts.exit.signal) {
        (Some(c), _) => Some((c & 0xff) << 8),
        (None, Some(s)) => Some(s & 0x7f),
        _ => None,
    };
    let members: Vec<Member> = rec
        .processes
        .iter()
        .map(|p| {
            let direct = p.pid == facts.pid;
            Member {
                pid: p.pid,
                name: p.name.clone(),
                last_seen_ns: p.last_seen_ns,
                ended_ns: if direct { Some(end) } else { p.ended_ns },
                wait_status: if direct { child_status } else { p.wait_status },
                last_rss: p.last_rss,
                exact_peak: if direct { Some(p.peak().0) } else { None },
                direct_child: direct,
            }
        })
        .collect();
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

/// A member's peak and where it comes from.
fn peak(m: &Member) -> (u64, &'static str) {
    match m.exact_peak {
        Some(p) => (p, "rusage"),
        None => (m.last_rss, "last_rss"),
    }
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
    let Some(v) = r.victims.first() else {
        // Nothing of the run's: say why a SIGKILL was not the kernel's, and
        // whether the kernel killed something else in the container.
        let sigkilled = inputs
            .members
            .iter()
            .find(|m| m.direct_child && m.signal() == Some(libc::SIGKILL));
        let outside = r.kills_outside_tree.filter(|&n| n > 0);
        return match (sigkilled, outside) {
            (_, Some(n)) => Some(format!(
                "the kernel's OOM killer killed {n} process{} in the container during the run, none of them this run's (the container's oom_kill counter rose; no process of the run ended then)",
                if n == 1 { "" } else { "es" }
            )),
            (Some(m), None) if r.oom_kill_rise.is_some() => Some(format!(
                "pid {} ({}) was killed by SIGKILL, but not by the kernel's OOM killer: the container's oom_kill counter did not rise (a process sent it: a user-space OOM daemon, a scheduler, or the program itself)",
                m.pid, m.name
            )),
            _ => None,
        };
    };
    let phase = v
        .phase
        .as_deref()
        .map(|p| format!(", in {p}"))
        .unwrap_or_default();
    let peak = match v.peak_source {
        "rusage" => format!("its peak RSS {} (exact)", units::bytes(v.peak_bytes)),
        _ => format!("its last RSS seen {} (sampled)", units::bytes(v.peak_bytes)),
    };
    let more = match r.victims.len() {
        1 => String::new(),
        n => format!(" ({} more of the run's processes with it)", n - 1),
    };
    let head = match (r.verdict, v.sigkill_seen) {
        (Level::Confirmed, _) => format!(
            "the kernel's OOM killer killed pid {} ({}) {} into the run{phase}{more}",
            v.pid,
            v.name,
            seconds(v.at_s)
        ),
        (_, false) => format!(
            "the kernel's OOM killer most likely killed pid {} ({}) {} into the run{phase}{more}: the container's oom_kill counter rose as it ended (how it ended was not seen: its parent reaped it first)",
            v.pid,
            v.name,
            seconds(v.at_s)
        ),
        (_, true) => format!(
            "pid {} ({}) was most likely killed by the kernel's OOM killer {} into the run{phase}: it died of SIGKILL with the container at its limit (this machine keeps no OOM-kill counter to confirm it)",
            v.pid,
            v.name,
            seconds(v.at_s)
        ),
    };
    Some(match container {
        Some(c) => format!("{head}; {peak}; {c}."),
        None => format!("{head}; {peak}."),
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
            name: name.into(),
            last_seen_ns: seen,
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
            name: "python".into(),
            last_seen_ns: end - 10 * MS,
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
        let r = detect(&inputs(&l, &members), &phase);
        assert_eq!(r.verdict, Level::Confirmed);
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
                 its peak RSS 7.81 GiB (exact); the container peaked at 7.99 GiB of its 8.00 GiB limit."
            )
        );
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
        let r = detect(&inputs(&l, &members), &no_phase);
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
        assert_eq!(r.verdict, Level::Confirmed);
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
        let r = detect(&inputs(&l, &members), &no_phase);
        assert_eq!(r.verdict, Level::None);
        assert_eq!(r.kills_outside_tree, Some(1));
        assert!(r.victims.is_empty());
        assert!(r.explanation.unwrap().contains("none of them this run's"));
        // A member that exited normally at that very time is not the victim.
        let members = [
            child(10 * S, EXIT_0),
            member(9, "worker", S, Some(S + 10 * MS), Some(EXIT_0)),
        ];
        assert_eq!(
            detect(&inputs(&l, &members), &no_phase).verdict,
            Level::None
        );
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
        assert_eq!(detect(&far, &no_phase).verdict, Level::None);
        // No cgroup at all: no counter and no limit, no claim.
        let none = CounterLog::default();
        let mut bare = inputs(&none, &members);
        bare.container = None;
        let r = detect(&bare, &no_phase);
        assert_eq!(
            (r.verdict, r.counters, r.explanation),
            (Level::None, None, None)
        );
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
        let r = detect(&inputs(&l, &members), &no_phase);
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
        let r = detect(&inputs(&l, &members), &no_phase);
        let root = crate::schema_check::load("docs/run-output.schema.json");
        let schema = serde_json::json!({ "$defs": root["$defs"], "$ref": "#/$defs/oom_kill" });
        let doc = serde_json::to_value(&r).unwrap();
        let errors = crate::schema_check::check(&schema, &doc);
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(doc["verdict"], "confirmed");
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
