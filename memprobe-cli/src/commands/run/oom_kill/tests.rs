//! The detector's tests over recorded transitions: counter readings,
//! members, the kernel's log, as the run would have recorded them.

use super::counters::CounterLog;
use super::detect;
use super::evidence::{Container, Inputs, KernelKill, KernelRecord, Member};
use super::verdict::{Evidence, Level};
use memprobe_core::internal::cgroup::OomEvents;
use memprobe_core::CgroupVersion;

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
        text.contains("in epoch 1 / step 7 (pid 4242 (python)'s phase: it sent none of its own)"),
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
