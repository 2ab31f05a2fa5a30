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
//!
//! The verdict is pure: [`evidence`] holds what it looks at, [`verdict`]
//! decides, [`explanation`] words it, [`counters`] keeps the counter
//! readings, [`from_run`] gathers the evidence from a finished run. The
//! side effects live apart: [`shield`] (memprobe's own `oom_score_adj`) and
//! [`zombies`] (polling `/proc` for how members ended).

mod counters;
mod evidence;
mod explanation;
mod from_run;
mod shield;
mod verdict;
mod zombies;

#[cfg(test)]
mod tests;

pub(crate) use counters::CounterLog;
pub(crate) use from_run::explain_run;
pub(crate) use shield::shield_self;
pub(crate) use verdict::OomKillReport;
#[cfg(test)]
pub(crate) use verdict::{Evidence, Level, VictimReport};
pub(crate) use zombies::ZombieWatch;

/// The verdict ([`verdict`]) and its paragraph ([`explanation`]), which
/// reads the verdict: decided first, then worded. `phase_at(pid, t)`: the
/// training phase open in process `pid` (or any process of the run, with
/// `None`) at `t` ns on `CLOCK_MONOTONIC`.
fn detect(
    inputs: &evidence::Inputs,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) -> OomKillReport {
    let mut report = verdict::decide(inputs, phase_at);
    report.explanation = explanation::explain(&report, inputs);
    report
}
