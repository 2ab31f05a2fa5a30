//! The detector's evidence gathered from a finished run (its recording,
//! the kernel's process events and log), and the verdict kept in it.

use super::detect;
use super::evidence::{Container, Inputs, KernelKill, KernelRecord, Member};
use crate::commands::run::kernel_log::KernelLog;
use crate::commands::run::process_events::Lifetimes;
use crate::commands::run::recording::Recording;
use crate::commands::run::report::RunFacts;

/// Runs the detector over a finished run (the child reaped, its `ru_maxrss`
/// folded in) and keeps the verdict in `rec.oom_kill`. `t0_monotonic_ns`:
/// `CLOCK_MONOTONIC` when the child was spawned; `lives`: what the kernel's
/// process events saw (or why they were not read); `kernel`: the kernel's
/// log of OOM kills.
pub(crate) fn explain_run(
    rec: &mut Recording,
    facts: &RunFacts,
    t0_monotonic_ns: u64,
    lives: Result<&Lifetimes, String>,
    kernel: &KernelLog,
    phase_at: &dyn Fn(Option<u32>, u64) -> Option<String>,
) {
    let rel = |mono: u64| mono.saturating_sub(t0_monotonic_ns);
    let mut members = sampled_members(rec, facts);
    add_orphans(&mut members, rec);
    let tracking = match lives {
        Ok(l) => add_lifetimes(&mut members, l, facts.pid, rel),
        Err(why) => Err(why),
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
        kernel: kernel_record(kernel, rel),
        tracking,
    };
    let report = detect(&inputs, phase_at);
    rec.oom_kill = Some(report);
}

/// The processes samples saw, the direct child with how it ended.
fn sampled_members(rec: &Recording, facts: &RunFacts) -> Vec<Member> {
    let end = (facts.duration_s * 1e9) as u64;
    let child_status = match (facts.exit.code, facts.exit.signal) {
        (Some(c), _) => Some((c & 0xff) << 8),
        (None, Some(s)) => Some(s & 0x7f),
        _ => None,
    };
    rec.processes
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
        .collect()
}

/// Orphans memprobe reaped: how a member samples saw ended. One no sample
/// saw may be an orphan of a process memprobe's own shell started before
/// it, not of the run: it is no member on that alone.
fn add_orphans(members: &mut [Member], rec: &Recording) {
    for o in &rec.orphans {
        if let Some(m) = members.iter_mut().find(|m| m.pid == o.pid) {
            m.wait_status = m.wait_status.or(Some(o.wait_status));
            m.ended_ns = m.ended_ns.or(Some(o.ended_ns));
        }
    }
}

/// Every birth and death the kernel's process events saw, folded into the
/// members (those no sample saw added); `Ok(())` when none was missed,
/// else why some were.
fn add_lifetimes(
    members: &mut Vec<Member>,
    l: &Lifetimes,
    child: u32,
    rel: impl Fn(u64) -> u64,
) -> Result<(), String> {
    for life in l.members.values() {
        match members.iter_mut().find(|m| m.pid == life.pid) {
            // The events' death is exact, and its status is seen.
            Some(m) => {
                m.born_ns = Some(rel(life.born_ns));
                if !m.direct_child {
                    m.ended_ns = life.ended_ns.map(&rel).or(m.ended_ns);
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
                ended_ns: life.ended_ns.map(&rel),
                wait_status: life.wait_status,
                last_rss: 0,
                exact_peak: None,
                direct_child: life.pid == child,
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

/// The kernel's log as evidence, on the run's clock.
fn kernel_record(kernel: &KernelLog, rel: impl Fn(u64) -> u64) -> KernelRecord {
    if !kernel.readable() {
        return KernelRecord::Unreadable(kernel.why_not().unwrap_or("not read").to_string());
    }
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
}
