//! The verdict's paragraph for the summary, in words.

use super::evidence::Inputs;
use super::verdict::{Evidence, Level, OomKillReport, OtherKill, VictimReport};
use crate::units;

/// Seconds into the run, always in seconds (a log's timestamps are
/// compared with it): `5.02 s`, `812.3 s`.
fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.1} s")
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
pub(super) fn explain(r: &OomKillReport, inputs: &Inputs) -> Option<String> {
    let no_log = r
        .kernel_log_unavailable
        .as_deref()
        .map(|why| format!("the kernel's log, which names each victim, was not read: {why}"));
    match r.victims.first() {
        Some(v) => Some(victim(r, inputs, v, no_log.as_deref())),
        None => no_victim(r, inputs, no_log.as_deref()),
    }
}

/// The container's peak and limit, for the victim's sentence.
fn container_peak(inputs: &Inputs) -> Option<String> {
    inputs.container.and_then(|c| {
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
    })
}

/// Nothing of the run's was killed: why a `SIGKILL` was not the kernel's,
/// and whether the kernel killed something else in the container.
fn no_victim(r: &OomKillReport, inputs: &Inputs, no_log: Option<&str>) -> Option<String> {
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
    match (r.verdict, sigkilled, outside) {
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
            "the kernel's OOM killer killed {} in the container during the run, none of them this run's (the kernel's log names {})",
            units::plural(n, "process", "processes"),
            named(&r.other_kills)
        )),
        (Level::None, _, Some(n)) => Some(format!(
            "the kernel's OOM killer killed {} in the container during the run, none of them this run's (the container's oom_kill counter rose; no process of the run ended then, and every birth and death of the run was seen)",
            units::plural(n, "process", "processes")
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
                no_log.unwrap_or("the kernel's log was incomplete")
            ))
        }
        (Level::Unknown, Some(m), _) => Some(format!(
            "pid {} ({}) was killed by SIGKILL; whether by the kernel's OOM killer is unknown: the container's OOM counters could not be read{}",
            m.pid,
            m.name,
            no_log.map(|t| format!(", and {t}")).unwrap_or_default()
        )),
        _ => None,
    }
}

/// The likeliest victim: who, when, in which phase, its peak, the
/// container's, and what ties it to the OOM killer.
fn victim(r: &OomKillReport, inputs: &Inputs, v: &VictimReport, no_log: Option<&str>) -> String {
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
            no_log.unwrap_or("the kernel's log was incomplete")
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
    match container_peak(inputs) {
        Some(c) => format!("{head}; {peak}; {c}.{evidence}"),
        None => format!("{head}; {peak}.{evidence}"),
    }
}
