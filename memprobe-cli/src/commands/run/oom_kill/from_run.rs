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
            // The events' death is exact, and its status is seen, unless a
            // sample saw the process after it: its main thread ended
            // (pthread_exit) while others ran on, and the process's own end
            // is the last thread's, which the events do not carry.
            Some(m) => {
                m.born_ns = Some(rel(life.born_ns));
                let ended = life.ended_ns.map(&rel);
                let outlived = ended.is_some_and(|e| m.last_seen_ns.is_some_and(|s| s > e));
                if !m.direct_child && !outlived {
                    m.ended_ns = ended.or(m.ended_ns);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::run::process_events::Life;

    fn sampled(pid: u32, last_seen_ns: u64) -> Member {
        Member {
            pid,
            ppid: Some(1),
            name: "worker".into(),
            last_seen_ns: Some(last_seen_ns),
            born_ns: None,
            ended_ns: None,
            wait_status: None,
            last_rss: 0,
            exact_peak: None,
            direct_child: false,
        }
    }

    /// The events say both ended at 1 µs; a sample saw the first at 2 µs
    /// (its main thread ended first, its other threads ran on): its end is
    /// not the events', the second's is.
    #[test]
    fn a_member_seen_after_its_main_thread_ended_is_not_ended_by_it() {
        let mut members = vec![sampled(10, 2_000), sampled(11, 500)];
        let mut l = Lifetimes::default();
        for pid in [10, 11] {
            l.members.insert(
                pid,
                Life {
                    pid,
                    ppid: 1,
                    name: "worker".into(),
                    born_ns: 0,
                    ended_ns: Some(1_000),
                    wait_status: Some(0),
                },
            );
        }
        let _ = add_lifetimes(&mut members, &l, 1, |t| t);
        assert_eq!((members[0].ended_ns, members[0].wait_status), (None, None));
        assert_eq!(
            (members[1].ended_ns, members[1].wait_status),
            (Some(1_000), Some(0))
        );
    }
}
